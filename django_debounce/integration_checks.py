"""System checks of the optional integrations: metrics (E040–E043) and Django's ``TASKS`` (E030–E034).

Split from :mod:`django_debounce.checks` (which registers them with the rest) so
each module stays one concern; ids are listed in docs/reference/checks.md.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error

from .conf import settings
from .exceptions import ConfigurationError


def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E040–E043: the metrics settings and environment (docs/howto/metrics.md, issue #11).

    E040 ``DEBOUNCE_METRICS`` is not None/True/False; E041 a bucket setting is
    malformed; E042 ``DEBOUNCE_METRICS = True`` without prometheus_client;
    E043 ``PROMETHEUS_MULTIPROC_DIR`` names no writable directory (every
    process would fail at its first metric update).
    """
    messages: list[CheckMessage] = []
    try:
        enabled = settings.metrics
    except ConfigurationError as exc:
        messages.append(
            Error(
                str(exc),
                hint="None (the default: on when prometheus_client is installed), True or False.",
                id="django_debounce.E040",
            )
        )
        enabled = None
    for attr in ("metrics_delay_buckets", "metrics_duration_buckets"):
        try:
            getattr(settings, attr)
        except ConfigurationError as exc:
            messages.append(
                Error(
                    str(exc),
                    hint=(
                        "Finite upper bounds in seconds, increasing, e.g. [1, 5, 30, 60, 300]; "
                        "prometheus_client adds +Inf itself."
                    ),
                    id="django_debounce.E041",
                )
            )
    if enabled is False:
        return messages
    if enabled and importlib.util.find_spec("prometheus_client") is None:
        messages.append(
            Error(
                "DEBOUNCE_METRICS = True but prometheus_client is not installed.",
                hint="pip install 'django-debounce[prometheus]', or set DEBOUNCE_METRICS = None "
                "(metrics on only when it is installed) or False.",
                id="django_debounce.E042",
            )
        )
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
        messages.append(
            Error(
                f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a writable directory.",
                hint="Create it (empty) before the processes start, and wipe it at every "
                "deployment; see docs/howto/metrics.md, 'Several processes on one host'.",
                id="django_debounce.E043",
            )
        )
    return messages


#: ``(module, error)`` of each app ``tasks`` module that ``TASKS`` kept from importing
#: (``AppConfig.ready``; check E033, decision 99).
TASK_MODULE_ERRORS: list[tuple[str, str]] = []

#: The backend's dotted path (``TASKS[alias]["BACKEND"]``).
DEBOUNCE_BACKEND = "django_debounce.backends.DebounceBackend"


def _has_tasks_framework() -> bool:
    from importlib.util import find_spec

    try:
        return find_spec("django.tasks") is not None or find_spec("django_tasks") is not None
    except (ImportError, ValueError):  # pragma: no cover - a broken install
        return False


def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E030, E033, E034: ``TASKS`` entries naming this package (issue #10 item 4, decision 99).

    * E030: a ``BACKEND`` under ``django_debounce`` that does not import
      (a typo), with the path it most likely means;
    * E033: an app's ``tasks`` module that could not be imported because
      ``TASKS`` names a backend that cannot be loaded (its tasks are unknown);
    * E034: ``DebounceBackend`` named, but neither ``django.tasks`` (Django
      6.0+) nor the ``django-tasks`` backport is installed.
    """
    from django.utils.module_loading import import_string

    messages: list[CheckMessage] = []
    tasks = getattr(django_settings, "TASKS", None)
    entries = tasks.items() if isinstance(tasks, dict) else []
    for alias, params in entries:
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str) or not path.startswith("django_debounce"):
            continue
        if not _has_tasks_framework():
            messages.append(
                Error(
                    f"TASKS[{alias!r}] names {path}, but Django's tasks framework is not "
                    "installed.",
                    hint="Use Django 6.0 or later, or on Django 5.2 pip install "
                    '"django-debounce[tasks]" (the django-tasks backport) and add '
                    '"django_tasks" to INSTALLED_APPS.',
                    id="django_debounce.E034",
                )
            )
            continue
        try:
            import_string(path)
        except ImportError as exc:
            messages.append(
                Error(
                    f"TASKS[{alias!r}]['BACKEND'] is {path!r}, which cannot be imported: {exc}",
                    hint=f"Did you mean {DEBOUNCE_BACKEND!r}?",
                    id="django_debounce.E030",
                )
            )
    for module, error in TASK_MODULE_ERRORS:
        messages.append(
            Error(
                f"{module} could not be imported, so its tasks are not registered: {error}",
                hint="Fix the BACKEND path in TASKS; every @task of that module names it.",
                id="django_debounce.E033",
            )
        )
    return messages
