"""The table of settings (decision 171): each ``DEBOUNCE_*`` setting declared once, in
``django_debounce/conf/table.py``, documented with its default and check id, and read
nowhere else."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest
from django.test import override_settings

from django_debounce.conf import DEFAULTS, ROWS, Settings
from django_debounce.conf import settings as debounce_settings
from django_debounce.exceptions import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_debounce"
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
CHECKS_PAGE = ROOT / "docs" / "reference" / "checks.md"

#: A ``DEBOUNCE_*`` name as a page writes it (not ``DEBOUNCE_*`` or the bare prefix).
NAME = re.compile(r"\bDEBOUNCE_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def _sections(page: str) -> dict[str, str]:
    """Each ``### `DEBOUNCE_X``` heading's text, up to the next heading of any level."""
    found: dict[str, str] = {}
    current: str | None = None
    for line in page.splitlines():
        if line.startswith("#"):
            heading = re.fullmatch(r"### `(DEBOUNCE_[A-Z0-9_]+)`", line.strip())
            current = heading.group(1) if heading else None
            if current:
                found[current] = ""
        elif current:
            found[current] += line + "\n"
    return found


def _shown(value: object) -> str:
    """A default as the settings page writes it: strings in double quotes, else ``repr``."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_every_row_is_documented_with_its_default_and_its_check():
    sections = _sections(SETTINGS_PAGE.read_text(encoding="utf-8"))
    wrong = []
    for row in ROWS:
        text = sections.get(row.name)
        if text is None:
            wrong.append(f"{row.name}: no '### `{row.name}`' section")
            continue
        default = re.search(r"Default:? `([^`]*)`", text)
        if default is None or default.group(1) != _shown(row.default):
            wrong.append(f"{row.name}: documented default {default and default.group(1)!r}")
        if row.check not in text:
            wrong.append(f"{row.name}: its check {row.check} is not named in its section")
    assert wrong == []


def test_every_setting_the_page_names_is_a_row():
    page = SETTINGS_PAGE.read_text(encoding="utf-8")
    names = {row.name for row in ROWS}
    assert set(NAME.findall(page)) - names == set()
    assert set(_sections(page)) == names


def test_every_row_has_an_id_and_a_hint_listed_on_the_checks_page():
    page = CHECKS_PAGE.read_text(encoding="utf-8")
    assert all(row.check and row.hint for row in ROWS)
    assert [row.name for row in ROWS if f"`{row.check_id}`" not in page] == []
    # One id per setting; the two histogram bucket settings share E041, as they always have.
    shared = {code: n for code, n in Counter(row.check for row in ROWS).items() if n > 1}
    assert shared == {"E041": 2}
    assert len({row.name for row in ROWS}) == len(ROWS)


def test_defaults_are_read_from_the_rows():
    assert DEFAULTS == {row.name.removeprefix("DEBOUNCE_"): row.default for row in ROWS}
    assert all(row.key == name for row, name in zip(ROWS, DEFAULTS, strict=True))


def test_a_read_is_kept_as_a_plain_attribute_until_the_setting_changes(settings):
    """``settings.codel`` is read on every claim: after the first read it is an attribute."""
    settings.DEBOUNCE_LEASE = "2m"
    first = debounce_settings.lease
    assert vars(debounce_settings)["lease"] is first
    with override_settings(DEBOUNCE_LEASE="3m"):
        assert "lease" not in vars(debounce_settings)  # setting_changed dropped it
        assert debounce_settings.lease.total_seconds() == 180
    assert debounce_settings.lease.total_seconds() == 120


def test_a_value_that_does_not_parse_is_not_kept_and_raises_at_every_read(settings):
    settings.DEBOUNCE_PREFETCH = -1
    for _ in range(2):
        with pytest.raises(ConfigurationError, match=r"^DEBOUNCE_PREFETCH=-1 "):
            debounce_settings.prefetch  # noqa: B018
    assert "prefetch" not in vars(debounce_settings)


def test_the_class_attribute_is_the_row():
    assert Settings.codel.name == "DEBOUNCE_QUEUES"
    assert Settings.codel in ROWS and Settings.use_tz not in ROWS  # Django's own, E011


# -- nobody but conf/ reads a DEBOUNCE_* setting ------------------------------------------


def _reads(tree: ast.AST) -> list[int]:
    """Lines that read a ``DEBOUNCE_*`` setting off an object: ``x.DEBOUNCE_LEASE``,
    ``getattr(x, "DEBOUNCE_LEASE")``/``hasattr``, or a name built with ``f"DEBOUNCE_{...}"``.
    A ``DEBOUNCE_*`` string anywhere else (a message, a docstring) is not a read."""

    def names_a_setting(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.startswith("DEBOUNCE_")
        if isinstance(node, ast.JoinedStr) and node.values:
            return names_a_setting(node.values[0])
        return False

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("DEBOUNCE_"):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and names_a_setting(node.args[1])
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_conf_reads_a_debounce_setting():
    stray = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "conf" not in path.relative_to(PACKAGE).parts[:1] and "migrations" not in path.parts
        for line in _reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert stray == []


def test_a_planted_read_is_found():
    planted = (
        "from django.conf import settings as django_settings\n"
        "a = django_settings.DEBOUNCE_LEASE\n"
        "b = getattr(django_settings, 'DEBOUNCE_PRUNE', None)\n"
        "c = getattr(django_settings, f'DEBOUNCE_{name}', None)\n"
        "d = getattr(django_settings, 'USE_TZ', True)\n"
        "raise ValueError('DEBOUNCE_LEASE is wrong')\n"
    )
    assert _reads(ast.parse(planted)) == [2, 3, 4]
