"""The parsed wake-up settings: ``DEBOUNCE_WAKEUP`` and ``DEBOUNCE_REDIS`` (decisions 80, 82).

A leaf beside :mod:`django_debounce.conf`, which reads the settings and parses
them here; checks E020–E024 report a bad value (:mod:`django_debounce.wakeup_checks`).
"""

from __future__ import annotations

from typing import Any

from .exceptions import ConfigurationError

#: The values ``DEBOUNCE_WAKEUP`` accepts (check E020).
WAKEUP_MODES = ("auto", "notify", "redis", "poll")


def parse_wakeup(value: Any) -> str:
    """Validate ``DEBOUNCE_WAKEUP`` and return it (decision 80).

    Args:
        value: one of :data:`WAKEUP_MODES`: ``"auto"`` (LISTEN/NOTIFY on
            PostgreSQL, else the Redis wake-up when ``DEBOUNCE_REDIS`` is set,
            else polling), ``"notify"``, ``"redis"`` or ``"poll"``.

    Raises:
        ConfigurationError: any other value.
    """
    if value not in WAKEUP_MODES:
        raise ConfigurationError(
            f"DEBOUNCE_WAKEUP={value!r} must be one of {', '.join(map(repr, WAKEUP_MODES))}."
        )
    return str(value)


def parse_redis_alias(value: Any) -> str | None:
    """Validate the type of ``DEBOUNCE_REDIS`` and return it: a cache alias or ``None``.

    Whether the alias exists in ``CACHES`` and is a django-redis cache is
    checked by system checks E023/E024 (decision 82).

    Raises:
        ConfigurationError: not ``None`` nor a non-empty ``str``.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"DEBOUNCE_REDIS={value!r} must be None or the alias (a str) of a django-redis "
            'cache in CACHES, e.g. "default".'
        )
    return value


__all__ = ["WAKEUP_MODES", "parse_redis_alias", "parse_wakeup"]
