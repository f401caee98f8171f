"""The reference pages cover the code (issue #20 item 1; decision 174).

The site's reference is generated: autodoc directives on ``docs/reference/*.md`` for the
public names, and ``docs/_ext/debounce_reference.py``'s directives for the settings, the
system checks, the command options and the metrics, which read their rows through
``docs/_ext/reference_sources.py``. These tests read the same sources without building
the site: a public name no autodoc directive reaches, a page without its directive, a
check id the checks page does not explain, an option without help or a metric without a
description fails here first (the Sphinx build, ``python3 dev.py docs``, runs in CI too).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import reference_sources as sources  # noqa: E402

#: ``.. automodule:: NAME`` / ``.. autoclass:: NAME`` (and the other auto* directives),
#: with the option lines under it.
AUTODOC = re.compile(
    r"^\.\. auto(module|class|function|data|exception|attribute)::\s*(\S+)\n((?:[ \t]+:.*\n)*)",
    re.MULTILINE,
)


def _documented(pages: dict[str, str]) -> dict[int, str]:
    """The objects the autodoc directives of ``pages`` document, by ``id``, with where."""
    found: dict[int, str] = {}
    for page, text in pages.items():
        for kind, target, options in AUTODOC.findall(text):
            if kind == "module":
                module = importlib.import_module(target)
                found[id(module)] = page
                members = re.search(r":members:(.*)", options)
                if members is None:
                    continue
                listed = [name.strip() for name in members.group(1).split(",") if name.strip()]
                for name in listed or sources.public_names(target):
                    found[id(getattr(module, name))] = f"{page}: {target}.{name}"
            else:
                module_name, _, name = target.rpartition(".")
                found[id(getattr(importlib.import_module(module_name), name))] = page
    return found


def _reference_pages() -> dict[str, str]:
    return {
        str(path.relative_to(DOCS)): path.read_text(encoding="utf-8")
        for path in sorted((DOCS / "reference").glob("*.md"))
    }


def _missing(pages: dict[str, str]) -> list[str]:
    documented = _documented(pages)
    return [
        f"{module}.{name}"
        for module in sources.PUBLIC_MODULES
        for name in sources.public_names(module)
        if id(getattr(importlib.import_module(module), name)) not in documented
    ]


def test_every_public_name_has_an_autodoc_entry():
    assert _missing(_reference_pages()) == []


def test_a_public_name_left_out_of_the_pages_is_found():
    pages = _reference_pages()
    pages["reference/api.md"] = pages["reference/api.md"].replace(
        ":members: TaskOptions, call_signature", ":members: call_signature"
    )
    assert _missing(pages) == ["django_debounce.tasks.TaskOptions"]


def _attribute_docstrings(module_name: str) -> set[str]:
    """Module-level names autodoc finds a docstring for: a string right after the
    assignment, or a ``#:`` comment right above it."""
    source = inspect.getsource(importlib.import_module(module_name))
    lines = source.splitlines()
    body = ast.parse(source).body
    found = set()
    for at, stmt in enumerate(body):
        if not isinstance(stmt, ast.Assign | ast.AnnAssign):
            continue
        after = body[at + 1] if at + 1 < len(body) else None
        documented = (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ) or lines[stmt.lineno - 2].strip().startswith("#:")
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if documented:
            found |= {target.id for target in targets if isinstance(target, ast.Name)}
    return found


def _defined_in(module_name: str, name: str) -> str:
    """The module ``name`` is assigned in: ``module_name``, or the one it imports it from."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and any(alias.name == name for alias in stmt.names):
            package = module_name if module_name.count(".") == 0 else module_name.rpartition(".")[0]
            return importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), package)
    return module_name


def test_every_public_name_has_a_docstring_autodoc_shows():
    """autodoc leaves out a member without a docstring: it would have no entry."""
    bare = []
    for module_name in sources.PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in sources.public_names(module_name):
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isroutine(value):
                if not (value.__doc__ or "").strip():
                    bare.append(f"{module_name}.{name}")
            elif name not in _attribute_docstrings(_defined_in(module_name, name)):
                bare.append(f"{module_name}.{name}")
    assert bare == []


def test_every_setting_row_says_what_it_is():
    """The generated table shows each row's ``#:`` comment; a row without one says nothing."""
    rows = sources.setting_rows()
    assert len(rows) >= 25
    assert [row.name for row in rows if not row.summary] == []
    assert "```{debounce-settings}" in (DOCS / "reference" / "settings.md").read_text()


def test_every_check_id_is_generated_and_explained_on_the_checks_page():
    page = (DOCS / "reference" / "checks.md").read_text(encoding="utf-8")
    assert "```{debounce-checks}" in page
    declared = {row.id for row in sources.check_rows()}
    explained = set(re.findall(r"^\| `(django_debounce\.[EW]\d{3})` \|", page, re.MULTILINE))
    assert declared - explained == set(), "ids without a row in the checks page's tables"
    assert explained - declared == set(), "ids the page explains that no check declares"
    assert {"django_debounce.E031", "django_debounce.W001", "django_debounce.E003"} <= declared


@pytest.mark.parametrize("name", sources.COMMANDS)
def test_every_command_and_option_has_a_reference_entry(name):
    page = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    assert f"```{{debounce-command}} {name}\n" in page
    options = sources.command_options(name)
    assert options, f"{name} declares no option of its own"
    assert [row.flags for row in options if not row.help.strip()] == []
    declared = {
        flag for action in sources.command_parser(name)._actions for flag in action.option_strings
    }
    shown = {flag for row in options for flag in row.flags.split(", ")}
    assert declared - shown <= sources.DJANGO_OPTIONS


def test_every_metric_has_a_reference_entry_and_a_description():
    rows = sources.metric_rows()
    names = [row.name for row in rows]
    assert len(names) == len(set(names)) >= 15
    assert [row.name for row in rows if not row.help] == []
    assert "```{debounce-metrics}" in (DOCS / "reference" / "metrics.md").read_text()
    howto = (DOCS / "howto" / "metrics.md").read_text(encoding="utf-8")
    assert [name for name in names if name not in howto] == []
