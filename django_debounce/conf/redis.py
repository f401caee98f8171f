"""Parsing of the ``DEBOUNCE_REDIS`` setting (issue #10 item 2; check E035).

A leaf: the settings table (:mod:`django_debounce.conf.table`) reads the
setting through :func:`parse_redis_alias` and the settings check reports what
it raises (E035); what the alias needs of ``CACHES`` and django-redis (E036-E039)
is :mod:`django_debounce.checks.redis`. Nothing here imports django-redis.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import ConfigurationError


def parse_redis_alias(value: Any) -> str | None:
    """Validate ``DEBOUNCE_REDIS`` and return the cache alias it names, or ``None`` (off).

    Args:
        value: ``None`` (rate-limit buckets stay in the database), or the name
            of a ``CACHES`` entry served by django-redis, e.g. ``"default"``.
            Whether the alias exists and uses django-redis is checked by the
            system checks E036-E039 (they read ``CACHES``; this parser does not).

    Raises:
        ConfigurationError: not ``None`` and not a non-empty ``str`` (check E035).
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"DEBOUNCE_REDIS={value!r} must be None (off) or the alias of a django-redis "
            'cache in CACHES, e.g. DEBOUNCE_REDIS = "default".'
        )
    return value


__all__ = ["parse_redis_alias"]
