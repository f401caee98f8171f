"""System checks of the executor settings and the Celery executor (E025–E029, E044, W013–W014; issue #10).

Registered with the package's other checks (:data:`django_debounce.checks.settings.ALL_CHECKS`);
every id is listed in docs/reference/checks.md.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from ... import registry
from ...conf import DEFAULTS
from ...conf.durations import parse_duration
from ...conf.executor import parse_celery_queues, parse_executor, parse_unknown_task_grace
from ...exceptions import ConfigurationError

#: A hand-off lease shorter than this likely lapses while the message is still on its way (W013).
SHORT_HANDOFF = timedelta(seconds=5)


def _setting(name: str) -> Any:
    return getattr(django_settings, f"DEBOUNCE_{name}", DEFAULTS[name])


def _celery_in_use() -> bool:
    """True when ``DEBOUNCE_EXECUTOR`` or a registered task selects the Celery executor."""
    if _setting("EXECUTOR") == "celery":
        return True
    return any(task.options.executor == "celery" for task in registry.all_tasks().values())


def check_executor_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E025–E027, E044 and W013: the executor settings must parse."""
    errors: list[CheckMessage] = []
    try:
        parse_unknown_task_grace(_setting("UNKNOWN_TASK_GRACE"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint="A duration such as '10m' (how long a job of a task this process does not "
                "know is put back before it is dead-lettered), or 0 to dead-letter it at once.",
                id="django_debounce.E044",
            )
        )
    try:
        parse_executor(_setting("EXECUTOR"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint="DEBOUNCE_EXECUTOR = 'worker' (the default) or 'celery'.",
                id="django_debounce.E025",
            )
        )
    try:
        parse_celery_queues(_setting("CELERY_QUEUES"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint='For example DEBOUNCE_CELERY_QUEUES = {"default": "celery", "mail": "mail"}.',
                id="django_debounce.E026",
            )
        )
    try:
        lease = parse_duration(
            _setting("CELERY_HANDOFF_LEASE"), name="DEBOUNCE_CELERY_HANDOFF_LEASE"
        )
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint="A duration such as '5m': how long a job handed to Celery may wait to start.",
                id="django_debounce.E027",
            )
        )
    else:
        if lease < SHORT_HANDOFF:
            errors.append(
                Warning(
                    f"DEBOUNCE_CELERY_HANDOFF_LEASE ({lease}) is shorter than {SHORT_HANDOFF}.",
                    hint=(
                        "A message that waits in the broker longer than the hand-off lease is "
                        "handed off again (the late message is then a no-op): every lapse costs "
                        "a publish and delays the job. Give it at least the longest time a "
                        "message waits for a free Celery worker."
                    ),
                    id="django_debounce.W013",
                )
            )
    return errors


def check_celery_available(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E028, E029 and W014: when the Celery executor is selected, Celery and its app must load."""
    if not _celery_in_use():
        return []
    if importlib.util.find_spec("celery") is None:
        return [
            Error(
                "The Celery executor is selected (DEBOUNCE_EXECUTOR or a task's executor=) but "
                "Celery is not installed.",
                hint="pip install 'django-debounce[celery]', or use executor='worker'.",
                id="django_debounce.E028",
            )
        ]
    path = _setting("CELERY_APP")
    if path is None:
        from celery import current_app

        app = current_app._get_current_object()
    else:
        try:
            app = import_string(path)
        except ImportError as exc:
            return [
                Error(
                    f"DEBOUNCE_CELERY_APP={path!r} does not import: {exc}",
                    hint="Give the dotted path of your Celery app, e.g. 'proj.celery.app', "
                    "or None to use Celery's current app.",
                    id="django_debounce.E029",
                )
            ]
    if getattr(app.conf, "task_always_eager", False):
        return [
            Warning(
                "The Celery app runs tasks eagerly (task_always_eager=True): the scheduler "
                "would run every handed-off job inside its own process, one at a time.",
                hint="Turn task_always_eager off where the scheduler runs; in tests, run the "
                "built-in worker instead (executor='worker').",
                id="django_debounce.W014",
            )
        ]
    return []


__all__ = ["check_celery_available", "check_executor_settings"]
