"""The package's system checks: one registrar, checks by concern (ids ``django_debounce.E0nn``/``W0nn``).

:func:`register_checks` registers every check, from ``DjangoDebounceConfig.ready``;
importing this package registers nothing. The checks live by concern:
:mod:`.settings` (the ``DEBOUNCE_*`` settings and the database), :mod:`.wakeup`
(the wake-up), and each integration's beside it
(:mod:`django_debounce.contrib.celery.checks`,
:mod:`django_debounce.contrib.django_tasks.checks`,
:mod:`django_debounce.contrib.prometheus.checks`); the Redis alias is checked by
:func:`django_debounce.conf.redis.check_redis`. Every id is listed in
docs/reference/checks.md and never renumbered.
"""

from __future__ import annotations

from django.core.checks import Tags, register

from ..conf.redis import check_redis
from ..contrib.celery.checks import check_celery_available, check_executor_settings
from ..contrib.django_tasks.checks import check_task_backends
from ..contrib.prometheus.checks import check_metrics
from .settings import (
    check_backoff_jitter,
    check_database_options,
    check_dead_letter_auto_retry,
    check_drain_settings,
    check_enqueue_retries,
    check_max_payload_bytes,
    check_prune,
    check_queues,
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
    check_queues,
    check_dead_letter_auto_retry,
    check_prune,
    check_max_payload_bytes,
    check_enqueue_retries,
    check_backoff_jitter,
    check_redis,
    check_metrics,
    check_drain_settings,
    check_unknown_settings,
    check_task_backends,
    check_executor_settings,
    check_celery_available,
    check_wakeup,
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
