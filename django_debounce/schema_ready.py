"""Tell "``migrate`` was not run" apart from other database errors of an enqueue (decision 158).

An enqueue does not check the tables first (that would cost a query per
call); when its write fails with a ``DatabaseError``, :func:`not_migrated`
asks the database which of the package's tables exist (one introspection
query, only on that failure path). If one is missing the caller raises
:class:`~django_debounce.exceptions.NotMigratedError` chained from the
driver's error, whatever the driver called it (``ProgrammingError`` on
PostgreSQL and MariaDB, ``OperationalError`` on SQLite).
"""

from __future__ import annotations

from django.apps import apps
from django.db import DatabaseError, connections

from .exceptions import NotMigratedError


def package_tables() -> list[str]:
    """Return the sorted names of the tables ``django_debounce``'s migrations create."""
    models = apps.get_app_config("django_debounce").get_models()
    return sorted({m._meta.db_table for m in models if m._meta.managed and not m._meta.proxy})


def not_migrated(exc: DatabaseError, using: str, what: str) -> NotMigratedError | None:
    """Return the error to raise instead of ``exc`` when database ``using`` lacks the tables.

    Args:
        exc: the error the write (``what``, e.g. ``"enqueue of 'app.t'"``) raised.
        using: the database alias it ran on.
        what: names the call, for the message.

    Returns:
        A :class:`NotMigratedError` saying to run ``python manage.py migrate``
        when one of :func:`package_tables` is missing; ``None`` when all exist
        (``exc`` is another error) or the database cannot be asked (e.g. a
        PostgreSQL transaction aborted by ``exc``): then raise ``exc`` itself.
    """
    try:
        present = set(connections[using].introspection.table_names())
    except DatabaseError:
        return None
    missing = [table for table in package_tables() if table not in present]
    if not missing:
        return None
    return NotMigratedError(
        f"{what} failed: database {using!r} has no table {missing[0]} (the django_debounce "
        "migrations have not run there): run python manage.py migrate."
    )


__all__ = ["not_migrated", "package_tables"]
