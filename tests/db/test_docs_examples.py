"""The Python examples of the docs run (issue #20 item 2; decisions 175, 176).

Every fenced ``python`` block of the pages in :data:`PAGES` runs against the test
settings and database, the blocks of one page in order in one namespace (a later block
may use a task an earlier one declared), as a reader pasting them would. A block that is
deliberately not runnable (a settings fragment, a transcript, a sketch using the
reader's own models) says so on the line above it::

    <!-- example: not run (a settings.py fragment) -->

and a block that needs a name the page assumes (the reader's ``payments`` client) gets
it from :data:`GIVEN`. A failure names the page, the block and its line.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import re
import traceback
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import override_settings

from django_debounce import debounced_task, registry
from django_debounce.checks.settings import check_settings

REPO = Path(__file__).resolve().parents[2]
#: Pages left out: the contract is kept verbatim (its Python is a sketch of the rules).
LEFT_OUT = {
    "docs/reference/contract.md",
}
#: The pages whose examples run: the README, the install page, the tutorial and demo, the
#: explanations, the how-to guides and the reference.
PAGES = [
    "README.md",
    "docs/install.md",
    "docs/tutorial.md",
    "docs/demo.md",
    *sorted(
        str(path.relative_to(REPO))
        for folder in ("explanation", "howto", "reference")
        for path in (REPO / "docs" / folder).glob("*.md")
        if str(path.relative_to(REPO)) not in LEFT_OUT
    ),
]
#: A ``python`` block, with the mark on the line above it if it has one.
BLOCK = re.compile(
    r"(?:^<!-- example: (?P<mark>[^\n]*?) -->\n)?^```python\n(?P<code>.*?)^```\s*$",
    re.MULTILINE | re.DOTALL,
)


def _service_down(*args: Any) -> None:
    """A client whose service is down (the circuit-breaker guide's ``billing``)."""
    raise ConnectionError("billing.internal: connection refused")


#: Names a page's examples assume the reader has (their own objects), by page.
GIVEN: dict[str, dict[str, Any]] = {
    "docs/howto/rate-limit-an-api.md": {"crm": SimpleNamespace(push=lambda contact_id: None)},
    "docs/howto/circuit-breaker.md": {"billing": SimpleNamespace(sync=_service_down)},
    "docs/explanation/flow-control.md": {"payments": SimpleNamespace(charge=lambda order_id: None)},
    "docs/reference/api.md": {"logger": logging.getLogger("docs.examples"), "users": []},
    "docs/demo.md": {"debounced_task": debounced_task, "Any": Any},
}

#: Pages whose examples import a module the test environment may not have, by page: they
#: run where it is installed (``django.tasks``: the Django 6.x cells of CI).
NEEDS = {"docs/howto/django-tasks.md": "django.tasks"}
#: Settings a page's block assigns that its later blocks run under, by page (the
#: Django-task guide's ``TASKS``, whose queue list its ``@task(queue_name=...)`` needs).
PAGE_SETTINGS = {"docs/howto/django-tasks.md": ("TASKS",)}


def blocks(page: str) -> list[tuple[int, str | None, str]]:
    """``(line, mark, code)`` of each ``python`` block of ``page`` (line: the fence's, 1-based)."""
    text = (REPO / page).read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code"))
        found.append((line, match.group("mark"), match.group("code")))
    return found


def _forget_redeclared(code: str, namespace: dict[str, Any]) -> None:
    """A page may declare a task again to show a variant (``charge`` with other options):
    drop the earlier declaration, as a fresh module of the reader's would not have it."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list:
            registry.unregister(f"{namespace['__name__']}.{node.name}")


def _check_settings(code: str, namespace: dict[str, Any]) -> None:
    """A block that sets ``DEBOUNCE_*`` (or ``TASKS``) values: the system checks accept them."""
    assigned = {
        target.id
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.startswith("DEBOUNCE_")
    }
    if assigned:
        with override_settings(**{name: namespace[name] for name in assigned}):
            errors = check_settings()
        assert errors == [], f"the system checks refuse {sorted(assigned)}: {errors}"


def test_the_pages_have_examples_to_run():
    runnable = [(page, line) for page in PAGES for line, mark, _ in blocks(page) if mark is None]
    assert len(runnable) >= 15


def _importable(module: str) -> bool:
    """Whether ``module`` (dotted) can be imported here."""
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class ExampleError(AssertionError):
    """A block of a page raised: the message names the page, the block and its line."""


def run_examples(page: str, found: list[tuple[int, str | None, str]]) -> None:
    """Run the blocks ``found`` of ``page`` in order in one namespace; raise :class:`ExampleError`."""
    before = set(registry.all_tasks())
    namespace: dict[str, Any] = {"__name__": "docs_examples." + re.sub(r"\W", "_", page[:-3])}
    namespace.update(GIVEN.get(page, {}))
    settings = contextlib.ExitStack()
    try:
        for number, (line, mark, code) in enumerate(found, 1):
            if mark is not None:
                if not mark.startswith("not run ("):
                    raise ExampleError(
                        f"{page}:{line}: block {number}'s mark should read "
                        f"'<!-- example: not run (why) -->', not {mark!r}"
                    )
                continue
            try:
                _forget_redeclared(code, namespace)
                exec(compile("\n" * line + code, page, "exec"), namespace)  # noqa: S102
                _check_settings(code, namespace)
                for name in PAGE_SETTINGS.get(page, ()):
                    if name in namespace and name in code:
                        settings.enter_context(override_settings(**{name: namespace[name]}))
            except Exception as exc:
                raise ExampleError(
                    f"{page}, python block {number} (line {line}) failed; mark it "
                    f"'<!-- example: not run (why) -->' if it is not meant to run:\n"
                    + traceback.format_exc(limit=-3)
                ) from exc
    finally:
        settings.close()
        for name in set(registry.all_tasks()) - before:
            registry.unregister(name)


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)  # the worker examples run threads
# A page whose needs this Django lacks (django.tasks on Django 5.2) is not collected: the
# cells of a Django that has them run it (no skip, which CI would have to explain).
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if blocks(page) and (page not in NEEDS or _importable(NEEDS[page]))],
)
def test_the_examples_of_the_page_run(page):
    try:
        run_examples(page, blocks(page))
    except ExampleError as failed:
        pytest.fail(str(failed), pytrace=False)


def test_a_failing_block_is_named_by_page_block_and_line():
    found = [(3, None, "x = 1\n"), (8, "not run (a fragment)", "nope(\n"), (10, None, "x / 0\n")]
    with pytest.raises(ExampleError) as failed:
        run_examples("docs/page.md", found)
    message = str(failed.value)
    assert message.startswith("docs/page.md, python block 3 (line 10) failed")
    assert 'File "docs/page.md", line 11' in message and "ZeroDivisionError" in message


def test_a_block_setting_a_value_the_checks_refuse_fails():
    with pytest.raises(ExampleError, match="the system checks refuse"):
        run_examples("docs/page.md", [(1, None, 'DEBOUNCE_LEASE = "soon"\n')])


def test_a_block_that_does_not_parse_is_named_too():
    with pytest.raises(ExampleError) as failed:
        run_examples("docs/page.md", [(4, None, ">>> build_report.delay(42)\n")])
    assert str(failed.value).startswith("docs/page.md, python block 1 (line 4) failed")
    assert "SyntaxError" in str(failed.value)


def test_a_setting_a_block_assigns_holds_for_the_later_blocks_of_its_page_only(monkeypatch):
    from django.conf import settings

    monkeypatch.setitem(PAGE_SETTINGS, "docs/page.md", ("DOCS_EXAMPLE_VALUE",))
    found = [
        (1, None, "DOCS_EXAMPLE_VALUE = 5\n"),
        (3, None, "from django.conf import settings\nassert settings.DOCS_EXAMPLE_VALUE == 5\n"),
    ]
    run_examples("docs/page.md", found)
    assert not hasattr(settings, "DOCS_EXAMPLE_VALUE")
