"""Every test the Guarantees page names exists (docs/explanation/guarantees.md, issue #18 item 6).

The page lists each promise beside the tests that prove it, as ``path::name`` and, after
the first of a row, ``::name`` for another test of the same file. A renamed or deleted
test makes the page lie; this fails first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "explanation" / "guarantees.md"
#: `tests/x/test_y.py::test_z` or, continuing the same file, `::test_z`.
CITED = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def test_every_test_the_guarantees_page_names_exists():
    missing = []
    cited = 0
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        current: str | None = None
        for path, name in CITED.findall(line):
            current = path or current
            assert current is not None, f"'::{name}' names no file before it: {line[:80]}"
            cited += 1
            if name not in _tests_in(REPO / current):
                missing.append(f"{current}::{name}")
    assert cited > 30, "the page should cite the tests behind its promises"
    assert missing == []
