"""System checks of what ``DEBOUNCE_REDIS`` needs of ``CACHES`` and django-redis (E036-E039).

The setting's own value is a row of the settings table (E035, reported by
:func:`django_debounce.checks.settings.check_settings`); these checks judge the
alias it names. Nothing here connects to Redis, and django-redis is imported
only when the setting is set (docs/howto/redis.md).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from ..conf import settings
from ..exceptions import ConfigurationError


def check_redis(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E036-E039: ``DEBOUNCE_REDIS`` names a django-redis cache that can run a script.

    E036: the alias is not in ``CACHES``; E037: django-redis is not installed; E038: the alias's
    ``BACKEND`` is not django-redis's ``RedisCache``; E039: its
    ``CLIENT_CLASS`` is django-redis's ``ShardClient``, which hands out no
    single connection (``get_redis_connection`` raises). Nothing connects to
    Redis here (docs/howto/redis.md). A value that is not an alias at all is
    E035, the row's own check (:func:`~django_debounce.checks.settings.check_settings`).
    """
    try:
        alias = settings.redis
    except ConfigurationError:  # E035: the row's own check (check_settings) reports it
        return []
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


__all__ = ["check_redis"]
