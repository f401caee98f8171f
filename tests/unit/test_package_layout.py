"""The package's layout rules (docs/explanation/design.md): imports point one way.

Read from the source with :mod:`ast`, so every import counts: at module level,
inside a function, or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "django_debounce"

#: What the models may import from the package: nothing above them.
MODEL_IMPORTS_ALLOWED = {"exceptions", "dead_letter_kinds", "durations"}
#: A module over this many lines holds more than one concept (the issue's "~400").
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports (relative names, e.g. ``"models"``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("django_debounce"):
                target = (node.module or "").removeprefix("django_debounce").lstrip(".")
            else:
                continue
            # ``from . import base`` imports the submodule ``base``, not its package.
            submodules = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            candidates = [m for m in submodules if m in modules] or [target]
        elif isinstance(node, ast.Import):
            candidates = [
                a.name.removeprefix("django_debounce").lstrip(".")
                for a in node.names
                if a.name.startswith("django_debounce.")
            ]
        else:
            continue
        found.update(c for c in candidates if c in modules and c not in ("", name))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def test_the_package_has_no_import_circle():
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    # The walk sees the package's modules and their imports, relative and absolute.
    assert len(edges) > 30, sorted(edges)
    assert {"models", "lifecycle"} <= edges["outcomes"]
    assert _cycles(edges) == []


def test_a_planted_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_models_import_nothing_above_them():
    modules = _modules()
    assert _imports("models", modules["models"], modules) <= MODEL_IMPORTS_ALLOWED


def test_no_module_holds_more_than_one_concepts_worth_of_lines():
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in _modules().values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
