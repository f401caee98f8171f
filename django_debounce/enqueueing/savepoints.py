"""Which enqueue calls take a savepoint of their own inside the caller's transaction (decision 205).

A savepoint costs two round trips (``SAVEPOINT`` and ``RELEASE``), more than
the ``INSERT`` it wraps (issue #23). A call needs one only when it could fail
after writing part of what it writes, or fail in a way that leaves the
caller's transaction unusable while the call itself could have recovered:

* **PostgreSQL** aborts the whole transaction on any failed statement, so a
  call takes no savepoint only when its one statement cannot fail by the
  package's own doing: a plain job's ``INSERT`` (it holds no unique column)
  and the trailing window's ``INSERT … ON CONFLICT (window_key) DO UPDATE``
  (a racing insert turns into the slide, never an ``IntegrityError``). Every
  value was validated before (§3), so no ``DataError`` reaches the server.
  Coalescing (``unique_key``/``idempotent``), ``debounce_merge`` (a read, then
  a write that can lose an insert race), leading/both edges and
  ``depends_on`` (several statements) keep the savepoint.
* **MariaDB/MySQL (InnoDB) and SQLite** roll a failed statement back alone
  and the transaction goes on, so a lost insert race is retried in place:
  every call that writes one row (plain, debounced with or without merge,
  coalesced) takes no savepoint; leading/both edges and ``depends_on`` write
  several rows and keep it.

A missing table (``migrate`` not run, decision 158) is the one failure the
calls above still meet on PostgreSQL; so a connection takes the savepoint
until it has written a job once (:func:`mark_written`), and the caller's
transaction stays usable after that :class:`~django_debounce.exceptions.NotMigratedError`.
Lock contention (a deadlock, a lock timeout, a serialization failure) inside
the caller's transaction already says to roll the transaction back
(:func:`~django_debounce.enqueueing.contention.contended`): a savepoint could
not help it, since the caller still holds its locks.
"""

from __future__ import annotations

import weakref

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..options import Plan

#: Connections (per thread: each has its own wrapper) that have written a job: their
#: database has the tables, so a bare statement cannot fail for want of them.
_written: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


def single_row(plan: Plan) -> bool:
    """True when the call writes at most one row: no ``depends_on``, no leading/both edge."""
    return not plan.depends_on and (plan.edge == "trailing" or plan.window_key is None)


def needs_savepoint(plan: Plan, db: str, by_upsert: bool) -> bool:
    """Return True when ``plan``'s write inside the caller's open transaction takes a savepoint.

    Args:
        plan: the planned call.
        db: the database alias it writes to.
        by_upsert: whether the call is one ``INSERT … ON CONFLICT`` statement.
    """
    if not single_row(plan):
        return True
    connection = transaction.get_connection(db)
    if connection.vendor != "postgresql":
        return False
    one_statement = by_upsert or (plan.window_key is None and plan.unique_lock is None)
    return not one_statement or connection not in _written


def mark_written(db: str) -> None:
    """Record that the connection of ``db`` has written a job (its tables exist)."""
    _written.add(transaction.get_connection(db))
