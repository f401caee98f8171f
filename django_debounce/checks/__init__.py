"""The package's system checks: one registrar, checks by concern (ids ``django_debounce.E0nn``/``W0nn``).

:func:`register_checks` registers every check, from ``DjangoDebounceConfig.ready``;
importing this package registers nothing. Every ``DEBOUNCE_*`` setting's own
value is checked by one loop over the settings table
(:func:`.settings.check_settings`, decision 171); the rest are named checks of
what a setting needs of another, of the database or of the environment, by
concern: :mod:`.settings` (setting pairs, ``USE_TZ``, the database options,
unknown names), :mod:`.redis` (the cache ``DEBOUNCE_REDIS`` names),
:mod:`.wakeup` (the wake-up), :mod:`.periodic` (the schedules of ``DEBOUNCE_SCHEDULES``), and each integration's beside it
(:mod:`django_debounce.contrib.celery.checks`,
:mod:`django_debounce.contrib.django_tasks.checks`,
:mod:`django_debounce.contrib.prometheus.checks`). Every id is listed in
docs/reference/checks.md and never renumbered.
"""

from __future__ import annotations

from django.core.checks import Tags, register

from ..contrib.celery.checks import check_celery_available, check_handoff_lease
from ..contrib.django_tasks.checks import check_task_backends
from ..contrib.prometheus.checks import check_metrics
from .periodic import check_settings_schedules
from .redis import check_redis
from .settings import (
    check_database_options,
    check_settings,
    check_unknown_settings,
    check_use_tz,
)
from .wakeup import check_notify_triggers, check_wakeup

#: Every check of the package, in the order ``manage.py check`` reports them.
ALL_CHECKS = (
    check_settings,
    check_database_options,
    check_use_tz,
    check_redis,
    check_metrics,
    check_unknown_settings,
    check_task_backends,
    check_handoff_lease,
    check_celery_available,
    check_wakeup,
    check_settings_schedules,
)


def register_checks() -> None:
    """Register :data:`ALL_CHECKS` with Django's check framework (``AppConfig.ready``).

    Registering twice is harmless: the framework keeps a set.
    """
    for check in ALL_CHECKS:
        register(check)
    # Reads the database's triggers, so it runs with ``--database`` (and migrate) only.
    register(check_notify_triggers, Tags.database)


__all__ = ["ALL_CHECKS", "register_checks"]
