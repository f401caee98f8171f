"""System checks of what the wake-up needs (ids E021, E022, W010–W012; docs/reference/checks.md).

``DEBOUNCE_WAKEUP`` and ``DEBOUNCE_REDIS`` (decisions 80, 82), checked
against the database the jobs are written to. Each setting's own value is a
row of the settings table (E020, E035: :func:`django_debounce.checks.settings.check_settings`);
these checks read the parsed values and say nothing about a refused one. W011
reads the database (the LISTEN/NOTIFY triggers of migration 0007) and so runs
only with ``manage.py check --database default`` (Django's ``database`` tag).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError, connections, router
from django.db.migrations.recorder import MigrationRecorder

from ..conf import settings
from ..exceptions import ConfigurationError
from ..worker.wakeup_modes import has_notify_support, notify_triggers_missing

#: The cache backend DEBOUNCE_REDIS must name (check E024).
DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
#: The migration that creates the NOTIFY triggers (check W011), as ``MigrationRecorder.applied_migrations()`` keys it.
NOTIFY_MIGRATION = ("django_debounce", "0007_wakeup_notify")


def _redis_unset() -> bool:
    """True when ``DEBOUNCE_REDIS`` is ``None`` (not when it does not parse: E035 says so)."""
    try:
        return settings.redis is None
    except ConfigurationError:
        return False


def _jobs_alias() -> str:
    return router.db_for_write(apps.get_model("django_debounce", "Job")) or "default"


def _mode() -> str | None:
    """``DEBOUNCE_WAKEUP``, or ``None`` when it does not parse (E020 reports that)."""
    try:
        return settings.wakeup
    except ConfigurationError:
        return None


def check_wakeup(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E021, E022, W010, W012: what a valid ``DEBOUNCE_WAKEUP`` needs."""
    mode = _mode()
    if mode is None:
        return []
    messages: list[CheckMessage] = []
    alias = _jobs_alias()
    postgres = connections[alias].vendor == "postgresql"
    if mode == "notify" and not postgres:
        messages.append(
            Error(
                f'DEBOUNCE_WAKEUP = "notify" needs PostgreSQL; database {alias!r} is '
                f"{connections[alias].vendor}.",
                hint='Use "redis" with DEBOUNCE_REDIS, "auto" or "poll" (docs/howto/wakeup.md).',
                id="django_debounce.E021",
            )
        )
    if mode == "redis" and _redis_unset():
        messages.append(
            Error(
                'DEBOUNCE_WAKEUP = "redis" needs DEBOUNCE_REDIS, the alias of a django-redis cache.',
                hint='Set DEBOUNCE_REDIS = "default" (a cache in CACHES), or another wake-up.',
                id="django_debounce.E022",
            )
        )
    if mode in ("auto", "notify") and postgres:
        if not has_notify_support():
            messages.append(
                Warning(
                    "The LISTEN/NOTIFY wake-up needs psycopg 3.2 or later; workers will poll.",
                    hint='pip install "psycopg>=3.2" (or "django-debounce[postgres]").',
                    id="django_debounce.W010",
                )
            )
        if connections[alias].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
            messages.append(
                Warning(
                    f"Database {alias!r} sets DISABLE_SERVER_SIDE_CURSORS, as for a PgBouncer in "
                    "transaction pooling mode, where LISTEN receives nothing: workers would "
                    "wake only by polling.",
                    hint="Connect workers to PostgreSQL directly or in session pooling mode, or set "
                    'DEBOUNCE_WAKEUP = "poll" (or "redis"); silence this if there is no such pooler.',
                    id="django_debounce.W012",
                )
            )
    return messages


def check_notify_triggers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W011 (database): the LISTEN/NOTIFY wake-up is on, migration 0007 is applied, its triggers are gone.

    Silent while ``0007_wakeup_notify`` is not applied (decision 159): on a
    fresh database ``migrate`` runs this check before it creates the triggers.
    """
    databases = kwargs.get("databases") or []
    alias = _jobs_alias()
    if alias not in databases or _mode() not in ("auto", "notify"):
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    try:
        recorder = MigrationRecorder(connection)
        # Not applied yet (a fresh database, and so every `migrate` that will create the
        # triggers): an unapplied migration, which Django reports itself; the worker warns.
        if not recorder.has_table() or NOTIFY_MIGRATION not in recorder.applied_migrations():
            return []
    except DatabaseError:  # no database yet: migrate reports it
        return []
    if not notify_triggers_missing(alias):
        return []
    return [
        Warning(
            f"The LISTEN/NOTIFY triggers of django_debounce are missing on database {alias!r}; "
            "idle workers wake only by polling.",
            hint="Migration 0007_wakeup_notify is recorded as applied but its triggers are gone "
            "(a restore without triggers? migrate --fake?): re-apply it with manage.py migrate "
            "django_debounce 0006, then manage.py migrate django_debounce.",
            id="django_debounce.W011",
        )
    ]


__all__ = ["check_notify_triggers", "check_wakeup"]
