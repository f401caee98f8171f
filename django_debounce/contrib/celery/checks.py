"""System checks of the Celery executor (E028, E029, W013, W014; issue #10).

The executor settings' own values are rows of the settings table (E025-E027,
E029 for a value that is not a dotted path, E044; reported by
:func:`django_debounce.checks.settings.check_settings`); these checks judge
what a valid value needs. Registered with the package's other checks
(:data:`django_debounce.checks.ALL_CHECKS`); every id is listed in
docs/reference/checks.md.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from ... import registry
from ...conf import settings
from ...exceptions import ConfigurationError

#: A hand-off lease shorter than this likely lapses while the message is still on its way (W013).
SHORT_HANDOFF = timedelta(seconds=5)


def _celery_in_use() -> bool:
    """True when ``DEBOUNCE_EXECUTOR`` or a registered task selects the Celery executor."""
    try:
        if settings.executor == "celery":
            return True
    except ConfigurationError:  # E025 reports it; the tasks may still select Celery
        pass
    return any(task.options.executor == "celery" for task in registry.all_tasks().values())


def check_handoff_lease(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W013: ``DEBOUNCE_CELERY_HANDOFF_LEASE`` is shorter than :data:`SHORT_HANDOFF` (5 s).

    A value that is not a duration is E027, the row's own check
    (:func:`django_debounce.checks.settings.check_settings`); nothing is said here then.
    """
    try:
        lease = settings.celery_handoff_lease
    except ConfigurationError:
        return []
    if lease >= SHORT_HANDOFF:
        return []
    return [
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
    ]


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
    try:
        path = settings.celery_app
    except ConfigurationError:  # not a dotted path at all: E029 from the row's own check
        return []
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


__all__ = ["check_celery_available", "check_handoff_lease"]
