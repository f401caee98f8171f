"""What the generated reference pages are built from, read from the code (no Sphinx here).

``docs/_ext/debounce_reference.py`` renders these rows as tables on the reference pages,
and ``tests/unit/test_docs_reference.py`` checks, from the same functions, that every
setting, check id, command option, metric and public name has an entry (decision 174).
Each function needs Django set up (``django.setup()``) with ``django_debounce`` installed.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import django_debounce

PACKAGE = Path(django_debounce.__file__).resolve().parent

#: The modules whose check functions declare the named checks (an ``id=`` in each
#: ``Error(...)``/``Warning(...)`` they build); the settings rows declare the rest.
CHECK_MODULES = (
    "checks/settings.py",
    "checks/redis.py",
    "checks/wakeup.py",
    "checks/periodic.py",
    "contrib/celery/checks.py",
    "contrib/django_tasks/checks.py",
    "contrib/django_tasks/backend.py",
    "contrib/prometheus/checks.py",
)

#: The management commands of the package (``django_debounce/management/commands``).
COMMANDS = tuple(
    sorted(
        path.stem
        for path in (PACKAGE / "management" / "commands").glob("*.py")
        if not path.stem.startswith("_")
    )
)

#: The public faces of the package: each module, and the names of it the reference must
#: document (``None``: its ``__all__`` when it has one, else every public class and function
#: it defines).
PUBLIC_MODULES: dict[str, tuple[str, ...] | None] = {
    "django_debounce": None,
    "django_debounce.tasks": None,
    "django_debounce.context": None,
    "django_debounce.breaker": None,
    "django_debounce.run_controls": ("RunControl",),
    "django_debounce.ops.window_handles": None,
    "django_debounce.models": ("Job", "DeadLetter"),
    "django_debounce.exceptions": None,
    "django_debounce.signals": (
        "job_enqueued",
        "job_started",
        "job_finished",
        "job_dead_lettered",
        "send_signal",
    ),
    "django_debounce.ops.windows": None,
    "django_debounce.ops.cancels": None,
    "django_debounce.ops.sweep": None,
    "django_debounce.ops.retention": None,
    "django_debounce.ops.status": None,
    "django_debounce.flow.hold_reasons": None,
    "django_debounce.schedules": None,
    "django_debounce.ops.periodic": None,
    "django_debounce.settings_schedules": None,
    "django_debounce.backends": None,
    "django_debounce.contrib.django_tasks.backend": None,
    "django_debounce.contrib.django_tasks.windows": None,
    "django_debounce.contrib.celery.executor": None,
    "django_debounce.contrib.celery.metrics": None,
    "django_debounce.contrib.prometheus.metrics": None,
    "django_debounce.tracing": ("tracer", "use_tracer_provider"),
    "django_debounce.contrib.prometheus.views": None,
}


# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingRow:
    name: str
    default: Any
    check_id: str
    hint: str
    summary: str


def setting_rows() -> list[SettingRow]:
    """Every ``DEBOUNCE_*`` row of the settings table, with the ``#:`` comment above it."""
    from django_debounce.conf import ROWS
    from django_debounce.conf.table import Settings

    comments = _attribute_comments(PACKAGE / "conf" / "table.py", Settings.__name__)
    return [
        SettingRow(row.name, row.default, row.check_id, row.hint or "", comments.get(row.attr, ""))
        for row in ROWS
    ]


def _attribute_comments(path: Path, class_name: str) -> dict[str, str]:
    """``#:`` comments above each assignment in the body of ``class_name`` (as autodoc reads them)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                comment: list[str] = []
                at = stmt.lineno - 2
                while at >= 0 and lines[at].strip().startswith("#:"):
                    comment.insert(0, lines[at].strip()[2:].strip())
                    at -= 1
                found[stmt.targets[0].id] = " ".join(comment)
    return found


# -- system checks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckRow:
    id: str
    level: str
    declared_in: str
    setting: str = ""


def check_rows() -> list[CheckRow]:
    """Every check id the package can report: the settings rows' ids, then the named checks'.

    A named check is an ``Error``/``Warning`` built with a literal ``id="django_debounce.X"``
    inside a function of :data:`CHECK_MODULES`; E003 and E008 are the pairs of
    ``checks/settings.py``'s ``_AT_LEAST`` table.
    """
    from django_debounce.checks.settings import _AT_LEAST
    from django_debounce.conf import ROWS

    rows: dict[str, CheckRow] = {}
    for row in ROWS:
        if row.check_id in rows:  # E041 covers both bucket settings
            first = rows[row.check_id]
            rows[row.check_id] = CheckRow(
                first.id, first.level, first.declared_in, f"{first.setting}, {row.name}"
            )
        else:
            rows[row.check_id] = CheckRow(row.check_id, "Error", "conf/table.py", row.name)
    for _shorter, longer, code, _hint in _AT_LEAST:
        rows[f"django_debounce.{code}"] = CheckRow(
            f"django_debounce.{code}", "Error", "checks/settings.py: check_settings", longer.name
        )
    for module in CHECK_MODULES:
        tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for call in ast.walk(func):
                if not isinstance(call, ast.Call):
                    continue
                level = getattr(call.func, "id", getattr(call.func, "attr", ""))
                if level not in ("Error", "Warning"):
                    continue
                for keyword in call.keywords:
                    value = keyword.value
                    if keyword.arg == "id" and isinstance(value, ast.Constant):
                        rows.setdefault(
                            value.value,
                            CheckRow(value.value, level, f"{module}: {func.name}"),
                        )
    return sorted(rows.values(), key=lambda row: row.id)


# -- management commands -----------------------------------------------------------------------


@dataclass(frozen=True)
class OptionRow:
    flags: str
    metavar: str
    default: str
    help: str


#: Options every Django command has (documented by Django, not here).
DJANGO_OPTIONS = frozenset(
    {
        "--version",
        "-h",
        "--help",
        "-v",
        "--verbosity",
        "--settings",
        "--pythonpath",
        "--traceback",
        "--no-color",
        "--force-color",
        "--skip-checks",
    }
)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The argument parser ``manage.py NAME`` builds (the command's ``add_arguments``)."""
    from django.core.management import load_command_class

    return load_command_class("django_debounce", name).create_parser("manage.py", name)


def command_options(name: str) -> list[OptionRow]:
    """The command's own options and arguments, as its parser declares them."""
    rows = []
    for action in command_parser(name)._actions:
        if set(action.option_strings) & DJANGO_OPTIONS or action.help == argparse.SUPPRESS:
            continue
        flags = ", ".join(action.option_strings) or action.dest
        if action.nargs == 0:
            metavar = ""
        elif action.metavar is not None:
            metavar = str(action.metavar)
        elif action.choices is not None:
            metavar = "{" + ",".join(str(choice) for choice in action.choices) + "}"
        else:
            metavar = action.dest.upper()
        default = "" if action.default in (None, False, argparse.SUPPRESS) else repr(action.default)
        text = (action.help or "").replace("%(default)s", str(action.default))
        rows.append(OptionRow(flags, metavar, default, text.replace("%%", "%")))
    return rows


def command_help(name: str) -> str:
    """The command's ``help`` text."""
    return command_parser(name).description or ""


# -- metrics -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    name: str
    kind: str
    labels: str
    help: str


def metric_rows() -> list[MetricRow]:
    """Every Prometheus metric the package exports: the counters and histograms
    (:func:`django_debounce.contrib.prometheus.metrics.get_metrics`) and the collector's
    gauges, as they are declared (needs prometheus_client)."""
    from django_debounce.contrib.prometheus.collector import DatabaseCollector
    from django_debounce.contrib.prometheus.metrics import get_metrics

    metrics = get_metrics()
    rows = []
    for field in fields(metrics):
        metric = getattr(metrics, field.name)
        suffix = "_total" if metric._type == "counter" else ""
        rows.append(
            MetricRow(
                metric._name + suffix,
                metric._type,
                ", ".join(metric._labelnames),
                metric._documentation,
            )
        )
    for family in DatabaseCollector()._families().values():
        rows.append(
            MetricRow(family.name, family.type, ", ".join(family._labelnames), family.documentation)
        )
    return rows


# -- public names --------------------------------------------------------------------------------


def public_names(module_name: str) -> list[str]:
    """The names the reference documents for ``module_name``: those :data:`PUBLIC_MODULES`
    gives, else ``__all__``, else every public class and function defined in the module."""
    import importlib

    module = importlib.import_module(module_name)
    names = PUBLIC_MODULES.get(module_name) or getattr(module, "__all__", None)
    if names is not None:
        return [name for name in names if not name.startswith("__")]
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == module_name
        and (inspect.isclass(value) or inspect.isfunction(value))
    )
