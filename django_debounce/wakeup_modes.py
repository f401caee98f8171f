"""Which wake-up a worker uses: ``DEBOUNCE_WAKEUP`` resolved for a database (decision 80).

Read by the worker's wake-up (:mod:`django_debounce.wakeup`) and by the Redis
publisher (:mod:`django_debounce.wakeup_redis`), so an enqueue publishes
only where workers listen on Redis.
"""

from __future__ import annotations

from functools import cache

from django.db import connections

from .conf import settings


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


__all__ = ["has_notify_support", "wakeup_mode"]
