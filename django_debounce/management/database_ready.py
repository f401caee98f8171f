"""Check, before a command's first query, that its database is there and migrated.

The package's commands (``debounce_status``, ``prune_debounce_jobs``,
``retry_dead_letters``, ``run_debounce_worker``) call :func:`require_tables` first, so a new user
gets one line saying what to do instead of a driver traceback (decision 130):
an unknown ``--database`` alias, an unreachable or missing database, or a
database without the package's tables (``migrate`` not run yet).
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DatabaseError, connections
from django.utils.connection import ConnectionDoesNotExist

from django_debounce.schema_ready import package_tables


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``str(exc)`` (drivers add hints and context below it)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def require_tables(using: str) -> None:
    """Raise ``CommandError`` unless database ``using`` answers and holds the package's tables.

    Args:
        using: a database alias (the command's ``--database``).

    Raises:
        CommandError: ``using`` is not in ``DATABASES`` (the message lists the
            configured aliases); the database cannot be reached or does not
            exist (the message names the alias and the driver's one-line
            error); or one of ``django_debounce``'s tables is missing (run
            ``python manage.py migrate``). One introspection query
            (``connection.introspection.table_names()``), nothing written.
    """
    try:
        connection = connections[using]
    except ConnectionDoesNotExist:
        aliases = ", ".join(repr(alias) for alias in connections)
        raise CommandError(
            f"--database {using!r} is not in DATABASES; configured: {aliases}."
        ) from None
    try:
        tables = set(connection.introspection.table_names())
    except DatabaseError as exc:
        raise CommandError(f"database {using!r} cannot be reached: {first_line(exc)}") from None
    if any(table not in tables for table in package_tables()):
        raise CommandError(
            f"no django_debounce tables in database {using!r}: run python manage.py migrate."
        )
