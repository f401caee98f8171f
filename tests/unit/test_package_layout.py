"""The package's layout rules (docs/explanation/design.md): imports point one way.

Read from the source with :mod:`ast`, so every import counts: at module level,
inside a function, or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "django_debounce"

#: What the models may import from the package: nothing above them (``periodic_ticks``: a model
#: of its own module, re-exported by ``models``).
MODEL_IMPORTS_ALLOWED = {
    "exceptions",
    "dead_letter_kinds",
    "durations",
    "periodic_ticks",
    "key_buckets",
}
#: A module over this many lines holds more than one concept (issue #19: "no module over ~400 lines").
MAX_LINES = 420


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
    assert {"models", "lifecycle"} <= edges["run.outcomes"]
    assert _cycles(edges) == []


def test_a_planted_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_models_import_nothing_above_them():
    modules = _modules()
    package = {name for name in modules if name == "models" or name.startswith("models.")}
    assert {"models", "models.jobs", "models.dead_letters"} <= package
    for name in sorted(package):
        assert _imports(name, modules[name], modules) - package <= MODEL_IMPORTS_ALLOWED, name


def test_no_module_holds_more_than_one_concepts_worth_of_lines():
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in _modules().values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


# -- the layers (docs/explanation/design.md, "The layers") ---------------------------------

#: A module's layer: its folder, or for a root module the kernel (or an edge).
EDGES = {"", "apps", "backends", "metrics_views", "celery_metrics"}
EDGE_FOLDERS = {"admin", "checks", "management"}
FOLDERS = {"conf", "enqueueing", "flow", "claim", "run", "worker", "ops"}


def layer(module: str) -> str:
    """The layer of a package module (a dotted name relative to the package)."""
    top = module.split(".")[0]
    if module in EDGES or top in EDGE_FOLDERS:
        return "edge"
    if top == "contrib":
        return ".".join(module.split(".")[:2])
    if top in FOLDERS:
        return top
    if module == "exceptions":
        return "exceptions"
    return "kernel"


KERNEL = {"kernel", "conf", "exceptions"}
#: What each layer may import (besides itself); an edge may import anything.
ALLOWED = {
    "exceptions": set(),
    "conf": {"exceptions"},
    "kernel": KERNEL,
    "enqueueing": KERNEL,
    "flow": KERNEL,
    "claim": {"flow", *KERNEL},
    "run": {"flow", *KERNEL},
    "ops": {"enqueueing", "flow", *KERNEL},
    "worker": {"claim", "run", "ops", "flow", *KERNEL},
    "contrib.celery": {"claim", "run", "ops", "flow", "worker", "enqueueing", *KERNEL},
    "contrib.django_tasks": {"enqueueing", "run", "flow", *KERNEL},
    "contrib.prometheus": {"run", "flow", *KERNEL},
}
#: Imports across the table on purpose, each lazy (inside a function) and said why.
CROSSINGS = {
    # Task.delay() and friends enqueue: the task knows the enqueue path only when called.
    ("tasks", "enqueueing.call"),
    ("tasks", "enqueueing.bulk"),
    # Task.window() and friends return window handles, which act through ops (decision 172).
    ("tasks", "ops.window_handles"),
    # A schedule's fixed arguments are planned as delay plans a call, at declaration (191).
    ("schedules", "enqueueing.planning"),
    # A Celery worker's metrics are Prometheus metrics (docs/howto/metrics.md).
    ("contrib.celery.metrics", "contrib.prometheus.metrics"),
}


def test_every_import_points_down_the_layer_table():
    modules = _modules()
    against = sorted(
        f"{name} ({layer(name)}) -> {target} ({layer(target)})"
        for name, path in modules.items()
        for target in _imports(name, path, modules)
        if layer(name) != "edge"
        and layer(target) != layer(name)
        and layer(target) not in ALLOWED[layer(name)]
        and (name, target) not in CROSSINGS
    )
    assert against == []


def test_nothing_imports_an_edge():
    modules = _modules()
    into_edges = sorted(
        f"{name} -> {target}"
        for name, path in modules.items()
        for target in _imports(name, path, modules)
        if layer(target) == "edge" and layer(name) != "edge" and target != ""
    )
    assert into_edges == []


def test_a_planted_import_against_the_table_is_found():
    assert layer("flow.rules") == "flow"
    assert layer("claim.claiming") == "claim"
    assert layer("contrib.celery.executor") == "contrib.celery"
    assert layer("models") == "kernel"
    assert "run" not in ALLOWED["claim"]  # the claim does not reach into outcomes
    assert "contrib.celery" not in ALLOWED["worker"]


def _third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


#: Integrations and where they may be imported (top-level package names).
INTEGRATIONS = {
    "celery": ("contrib.celery",),
    "kombu": ("contrib.celery",),
    "django.tasks": ("contrib.django_tasks",),
    "django_tasks": ("contrib.django_tasks",),
    "prometheus_client": ("contrib.prometheus", "contrib.celery.metrics"),
    # Redis serves the token buckets and the wake-up (and the cache its alias names is checked).
    "redis": ("flow.redis_buckets", "flow.redis_tokens", "worker.wakeup_redis", "checks.redis"),
    "django_redis": (
        "flow.redis_buckets",
        "flow.redis_tokens",
        "worker.wakeup_redis",
        "checks.redis",
    ),
}


def test_integrations_are_imported_only_where_they_serve():
    stray = []
    for name, path in _modules().items():
        for imported in _third_party_imports(path):
            for library, homes in INTEGRATIONS.items():
                if imported == library or imported.startswith(library + "."):
                    if not any(name == h or name.startswith(h + ".") for h in homes):
                        stray.append(f"{name} imports {imported}")
    assert stray == []


def test_every_module_the_design_page_names_exists():
    import importlib
    import re

    page = (PACKAGE.parent / "docs" / "explanation" / "design.md").read_text(encoding="utf-8")
    files = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", page))
    missing = sorted(
        f for f in files if not (PACKAGE / f).is_file() and not (PACKAGE.parent / f).is_file()
    )
    dotted = set(re.findall(r"`(django_debounce(?:\.[A-Za-z_]+)+)", page))
    unknown = []
    for path in sorted(dotted):
        module, _, attr = path.rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), attr)
        except ImportError:
            found = False
        if not found:
            try:
                importlib.import_module(path)
            except ImportError:
                unknown.append(path)
    assert len(files) > 10 and len(dotted) > 5
    assert missing == [] and unknown == []


def test_the_tests_mirror_the_package_folders():
    """tests/<tier>/<folder>/ holds the tests of django_debounce/<folder>/; the tier's root, the kernel's."""
    tests = PACKAGE.parent / "tests"
    tiers = [tests / "unit", tests / "db", tests / "processes"]
    folders = {
        path.relative_to(tier).as_posix()
        for tier in tiers
        for path in tier.rglob("*")
        if path.is_dir() and path.name != "__pycache__"
    }
    assert {"claim", "flow", "contrib/celery"} <= folders
    assert sorted(f for f in folders if not (PACKAGE / f / "__init__.py").is_file()) == []
