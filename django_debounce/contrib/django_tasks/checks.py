"""System checks of Django's ``TASKS`` entries that name this package (E030, E033, E034).

Registered by :func:`django_debounce.checks.register_checks` with the rest; ids are
listed in docs/reference/checks.md and never renumbered.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error

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
