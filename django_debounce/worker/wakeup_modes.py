"""Which wake-up a worker uses: ``DEBOUNCE_WAKEUP`` resolved for a database (decision 80).

Read by the worker's wake-up (:mod:`django_debounce.worker.wakeup`) and by the Redis
publisher (:mod:`django_debounce.worker.wakeup_redis`), so an enqueue publishes
only where workers listen on Redis.
"""

from __future__ import annotations

from functools import cache

from django.db import DatabaseError, connections

from ..conf import settings


@cache
def has_notify_support() -> bool:
    """Return True if psycopg 3.2+ (``Connection.notifies(timeout=…)``) is importable."""
    try:
        import psycopg
    except ImportError:
        return False
    major, minor = (int(part) for part in psycopg.__version__.split(".")[:2])
    return (major, minor) >= (3, 2)


def wakeup_mode(using: str) -> str:
    """Return the wake-up a worker on database alias ``using`` uses: ``notify``, ``redis`` or ``poll``.

    ``DEBOUNCE_WAKEUP = "auto"`` (the default) picks ``notify`` on PostgreSQL
    with psycopg 3.2+, else ``redis`` when ``DEBOUNCE_REDIS`` names a cache,
    else ``poll``. An explicit ``"notify"`` that cannot work here (another
    database, an older driver; checks E021/W010) polls, as does ``"redis"``
    without ``DEBOUNCE_REDIS`` (E022). Decision 80.

    Raises:
        ConfigurationError: ``DEBOUNCE_WAKEUP`` or ``DEBOUNCE_REDIS`` is invalid.
    """
    mode = settings.wakeup
    notify_ok = connections[using].vendor == "postgresql" and has_notify_support()
    if mode == "auto":
        if notify_ok:
            return "notify"
        return "redis" if settings.redis else "poll"
    if mode == "notify":
        return "notify" if notify_ok else "poll"
    if mode == "redis":
        return "redis" if settings.redis else "poll"
    return "poll"


#: The triggers of migration ``0007_wakeup_notify`` that feed LISTEN/NOTIFY (check W011, the worker).
NOTIFY_TRIGGERS = ("django_debounce_wakeup_insert", "django_debounce_wakeup_update")


def notify_triggers_missing(using: str) -> bool:
    """Return True when PostgreSQL database ``using`` lacks a trigger of :data:`NOTIFY_TRIGGERS`.

    One query on ``pg_trigger``. False on another database (there is no
    trigger to miss), and when the database cannot be asked: the caller then
    goes on as if they were there (the worker's claim meets the same error).
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname IN (%s, %s) AND NOT tgisinternal",
                list(NOTIFY_TRIGGERS),
            )
            row = cursor.fetchone()
    except DatabaseError:
        return False
    return row is not None and int(row[0]) < len(NOTIFY_TRIGGERS)


__all__ = ["NOTIFY_TRIGGERS", "has_notify_support", "notify_triggers_missing", "wakeup_mode"]
