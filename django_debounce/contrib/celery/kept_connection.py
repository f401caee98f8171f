"""A database connection the Celery task keeps across jobs, whatever Celery's Django fixup closes.

Celery's Django fixup (``celery.fixups.django``, Celery 5.x) closes every
database connection of the worker thread before and after each task, unless
``CELERY_DB_REUSE_MAX`` is set, and it does so whatever ``CONN_MAX_AGE`` says:
it calls ``close()``, not ``close_if_unusable_or_obsolete()``. So each handed-off
job opened a new PostgreSQL connection (a forked server process, ~3 ms): with
Celery's defaults the executor drained at less than half its rate
(bench/celery_drain.py, issue #23).

:func:`kept_connection` gives the task's thread its own connection object
for the job's database alias while the task runs (the ORM's
``connections[alias]`` is that object for the task's thread, the job's own
task included), and puts the thread's usual one back before Celery's
``task_postrun`` closes it. Its own object is not among the ones the fixup
closes, so it lives on to the next job, as the built-in worker's connection
does (decision 184). It is made usable before each job, as Django does before
a request: closed and reopened when a task left it outside autocommit, when
``CONN_MAX_AGE`` (set above 0) has passed, or when it had an error or idled
for :data:`IDLE_CHECK` seconds and no longer answers ``is_usable()``.

Nothing is swapped when the thread is inside a transaction (a test calling
the task inside ``TestCase``) or on SQLite (a file or in-memory database the
thread's own connection already reaches cheaply).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

logger = logging.getLogger("django_debounce.celery")

#: Seconds a kept connection may idle before the next job tests it with ``is_usable()``.
IDLE_CHECK = 1.0

_local = threading.local()
_announced: set[tuple[int, str]] = set()  # (pid, alias) already logged


def _kept(using: str) -> dict[str, Any]:
    """Return this thread's kept connection and its last use for ``using`` (made on first use)."""
    kept: dict[str, dict[str, Any]] | None = getattr(_local, "kept", None)
    if kept is None or getattr(_local, "pid", None) != os.getpid():
        # A forked child: the parent's connections are not this process's to use or close.
        kept = _local.kept = {}
        _local.pid = os.getpid()
    entry = kept.get(using)
    if entry is None:
        entry = kept[using] = {"wrapper": connections.create_connection(using), "used": 0.0}
        if (os.getpid(), using) not in _announced:
            _announced.add((os.getpid(), using))
            logger.info(
                "Celery's Django fixup closes the database connections of a worker around every "
                "task unless CELERY_DB_REUSE_MAX is set; django_debounce.run_job keeps its own "
                "connection to database %r across jobs in this worker process (decision 184)",
                using,
                extra={"action": "keep_connection"},
            )
    return entry


def _make_usable(entry: dict[str, Any]) -> None:
    """Close the kept connection if the next job should not use it (it reconnects on first use)."""
    wrapper = entry["wrapper"]
    if wrapper.connection is None:
        return
    max_age = wrapper.settings_dict.get("CONN_MAX_AGE", 0)
    stale = (
        wrapper.get_autocommit() != wrapper.settings_dict["AUTOCOMMIT"]
        or (max_age and wrapper.close_at is not None and time.monotonic() >= wrapper.close_at)
        or (
            (wrapper.errors_occurred or time.monotonic() - entry["used"] >= IDLE_CHECK)
            and not wrapper.is_usable()
        )
    )
    if stale:
        try:
            wrapper.close()
        except (DatabaseError, InterfaceError):
            wrapper.connection = None
    else:
        wrapper.errors_occurred = False


@contextmanager
def kept_connection(using: str) -> Iterator[None]:
    """Run the block on this thread's kept connection for ``using`` (see the module's doc).

    Args:
        using: the job's database alias.
    """
    current = connections[using]
    if current.in_atomic_block or current.vendor == "sqlite":
        yield
        return
    entry = _kept(using)
    _make_usable(entry)
    connections[using] = entry["wrapper"]
    try:
        yield
    finally:
        connections[using] = current
        entry["used"] = time.monotonic()


def close_kept() -> None:
    """Close this thread's kept connections (a thread that stops; errors are ignored)."""
    for entry in getattr(_local, "kept", {}).values():
        try:
            entry["wrapper"].close()
        except (DatabaseError, InterfaceError):
            entry["wrapper"].connection = None


__all__ = ["IDLE_CHECK", "close_kept", "kept_connection"]
