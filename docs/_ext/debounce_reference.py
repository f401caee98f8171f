"""Sphinx directives that render the reference from the code (decision 174).

* ``debounce-settings``: every row of the settings table (``django_debounce/conf/table.py``):
  name, default, check id, what it is (the row's ``#:`` comment) and the check's hint.
* ``debounce-checks``: every system check id, from the rows and the check functions' own
  ``Error``/``Warning`` declarations, with its level and where it is declared.
* ``debounce-command NAME``: the options of ``manage.py NAME``, from the parser the
  command builds.
* ``debounce-metrics``: every Prometheus metric, from its declaration.

The rows come from :mod:`reference_sources`, which ``tests/unit/test_docs_reference.py``
also reads. Napoleon (Google-style docstrings) is left off for attribute and property
docstrings, whose first line it would read as ``type: description``.
"""

from __future__ import annotations

from typing import Any

import reference_sources as sources
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.ext import napoleon
from sphinx.util.docutils import SphinxDirective


def _cell(value: str, literal: bool = False) -> nodes.entry:
    entry = nodes.entry()
    paragraph = nodes.paragraph()
    if value and literal:
        paragraph += nodes.literal(value, value)
    elif value:
        # ``text`` in a docstring-like line is code, the rest plain text.
        for at, part in enumerate(value.split("``")):
            if part:
                paragraph += nodes.literal(part, part) if at % 2 else nodes.Text(part)
    entry += paragraph
    return entry


def _table(header: list[str], rows: list[list[tuple[str, bool]]], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["debounce-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for title in header:
        row += _cell(title)
    head += row
    body = nodes.tbody()
    group += body
    for values in rows:
        row = nodes.row()
        for value, literal in values:
            row += _cell(value, literal)
        body += row
    return table


class SettingsDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(sources.PACKAGE / "conf" / "table.py"))
        rows = [
            [
                (row.name, True),
                (_shown(row.default), True),
                (row.check_id.removeprefix("django_debounce."), True),
                (row.summary, False),
            ]
            for row in sources.setting_rows()
        ]
        return [_table(["setting", "default", "check", "what it is"], rows, [30, 10, 8, 52])]


def _shown(value: object) -> str:
    """A default as the settings page writes it: strings in double quotes, else ``repr``."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


class ChecksDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        rows = [
            [(row.id, True), (row.level, False), (row.setting, True), (row.declared_in, True)]
            for row in sources.check_rows()
        ]
        return [_table(["id", "level", "setting", "declared in"], rows, [20, 8, 30, 40])]


class CommandDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        if name not in sources.COMMANDS:
            raise self.error(f"{name!r} is not a command of django_debounce: {sources.COMMANDS}")
        out: list[nodes.Node] = []
        description = sources.command_help(name)
        if description:
            out.append(nodes.paragraph(description, description))
        rows = [
            [(row.flags, True), (row.metavar, True), (row.default, True), (row.help, False)]
            for row in sources.command_options(name)
        ]
        out.append(_table(["option", "value", "default", "help"], rows, [25, 15, 12, 48]))
        return out


class MetricsDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        rows = [
            [(row.name, True), (row.kind, False), (row.labels, True), (row.help, False)]
            for row in sources.metric_rows()
        ]
        return [_table(["metric", "type", "labels", "help"], rows, [40, 10, 20, 30])]


def _napoleon_but_attributes(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if what not in ("attribute", "data", "property"):
        napoleon._process_docstring(app, what, name, obj, options, lines)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.napoleon")
    listeners = app.events.listeners["autodoc-process-docstring"]
    for listener in list(listeners):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", _napoleon_but_attributes)
    app.add_directive("debounce-settings", SettingsDirective)
    app.add_directive("debounce-checks", ChecksDirective)
    app.add_directive("debounce-command", CommandDirective)
    app.add_directive("debounce-metrics", MetricsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
