"""The ``DEBOUNCE_REDIS`` setting: parsed here, checked here (issue #10 item 2; E035-E039).

A leaf beside :mod:`django_debounce.conf` (which reads the setting and parses
it with :func:`parse_redis_alias`) and :mod:`django_debounce.checks.settings` (which
registers :func:`check_redis`). Nothing here connects to Redis or imports
django-redis at import time (docs/howto/redis.md).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

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


def check_redis(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E035-E039: ``DEBOUNCE_REDIS`` names a django-redis cache that can run a script.

    E035: not ``None`` or a non-empty string; E036: the alias is not in
    ``CACHES``; E037: django-redis is not installed; E038: the alias's
    ``BACKEND`` is not django-redis's ``RedisCache``; E039: its
    ``CLIENT_CLASS`` is django-redis's ``ShardClient``, which hands out no
    single connection (``get_redis_connection`` raises). Nothing connects to
    Redis here (docs/howto/redis.md).
    """
    try:
        alias = parse_redis_alias(getattr(django_settings, "DEBOUNCE_REDIS", None))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint='Name a CACHES alias served by django-redis, e.g. DEBOUNCE_REDIS = "default".',
                id="django_debounce.E035",
            )
        ]
    if alias is None:
        return []
    caches = getattr(django_settings, "CACHES", {}) or {}
    if alias not in caches:
        return [
            Error(
                f"DEBOUNCE_REDIS={alias!r} names no cache: CACHES has {sorted(caches)}.",
                hint=(
                    "Add a django-redis cache under that alias, e.g. CACHES["
                    f'{alias!r}] = {{"BACKEND": "django_redis.cache.RedisCache", '
                    '"LOCATION": "redis://127.0.0.1:6379/0"}, or name an existing one.'
                ),
                id="django_debounce.E036",
            )
        ]
    try:
        from django_redis.cache import RedisCache
        from django_redis.client.sharded import ShardClient
    except ImportError:
        return [
            Error(
                "DEBOUNCE_REDIS is set but django-redis is not installed.",
                hint='Install the extra: pip install "django-debounce[redis]".',
                id="django_debounce.E037",
            )
        ]
    config = caches[alias]
    backend = _imported(config.get("BACKEND", ""))
    if not (isinstance(backend, type) and issubclass(backend, RedisCache)):
        return [
            Error(
                f"CACHES[{alias!r}] (DEBOUNCE_REDIS) uses {config.get('BACKEND')!r}, "
                "not django-redis.",
                hint=(
                    'Set its "BACKEND" to "django_redis.cache.RedisCache": the buckets need '
                    "django_redis.get_redis_connection(). Django's own "
                    "django.core.cache.backends.redis.RedisCache gives no raw connection."
                ),
                id="django_debounce.E038",
            )
        ]
    client = _imported((config.get("OPTIONS") or {}).get("CLIENT_CLASS", ""))
    if isinstance(client, type) and issubclass(client, ShardClient):
        return [
            Error(
                f"CACHES[{alias!r}] (DEBOUNCE_REDIS) uses django-redis's ShardClient, "
                "which gives no single connection to run the bucket script on.",
                hint=(
                    "Point DEBOUNCE_REDIS at a cache with the default client (or the "
                    "Sentinel or Herd client): one Redis server or one Sentinel-managed primary."
                ),
                id="django_debounce.E039",
            )
        ]
    return []


def _imported(path: str) -> object:
    """Return the object at dotted ``path``, or ``None`` when it does not import."""
    if not path:
        return None
    try:
        return import_string(path)
    except ImportError:
        return None


__all__ = ["check_redis", "parse_redis_alias"]
