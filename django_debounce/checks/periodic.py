"""System check of the periodic schedules declared in settings (id ``django_debounce.E048``, decision 209).

``DEBOUNCE_SCHEDULES``'s shape is the settings table's row (E047); here each
entry is resolved against the registered tasks
(:func:`django_debounce.settings_schedules.settings_schedules`), as the
workers will: an unknown task, a cron expression or zone the parser refuses,
arguments that do not fit the task or cannot resolve its keys, a name a
schedule in code already holds.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error

from ..exceptions import ConfigurationError
from ..settings_schedules import settings_schedules


def check_settings_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report each ``DEBOUNCE_SCHEDULES`` entry that would not run (E048), naming the entry."""
    try:
        resolved = settings_schedules(log=False)
    except ConfigurationError:
        return []  # the setting's shape: E047 reports it
    return [
        Error(
            str(error),
            hint='Fix the entry (docs/howto/periodic-tasks.md, "Declare one in settings"); '
            "until then its schedule does not run.",
            obj=f"DEBOUNCE_SCHEDULES[{name!r}]",
            id="django_debounce.E048",
        )
        for name, error in resolved.errors.items()
    ]


__all__ = ["check_settings_schedules"]
