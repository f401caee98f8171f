"""The worker's database connections: close the ones a server dropped or that are too old (§7).

A worker holds connections for hours; a database restart, a server or proxy
idle timeout (``idle_session_timeout``, PgBouncer) or ``CONN_MAX_AGE`` ends
them under it. :func:`close_dropped_connections` runs before each job on a job
thread; :func:`upkeep_loop_connection` before each poll of the loop (decision 66).
"""

from __future__ import annotations

import time

from django.db import close_old_connections, connections

#: Seconds a busy worker's loop connection may sit unused before the loop tests it
#: (``SELECT 1``) instead of trusting it: a fast drain never pays the test, a loop that
#: waited through long jobs notices a connection a server idle timeout closed.
LOOP_RECHECK_AFTER = 1.0


def close_dropped_connections() -> None:
    """Close this thread's persistent connections that the server dropped (§7).

    ``close_old_connections()`` tests a connection only after an error on it,
    so one killed while idle (``CONN_MAX_AGE`` > 0, a database restart, an
    idle timeout) would fail the next job's first query and spend a retry.
    One ``SELECT 1`` before a job on a reused connection avoids that.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


def upkeep_loop_connection(
    using: str, *, idle: bool, unused_for: float, keep: bool = False
) -> None:
    """Apply ``CONN_MAX_AGE`` to the worker loop's connection on ``using`` (decision 66).

    The loop's connection is the worker's own (claims, lease renewal,
    reclaim, sweep), not a task's: it is kept while jobs run or were just
    claimed. Only after an ``idle`` poll does Django's ``close_old_connections()``
    run, so with ``CONN_MAX_AGE=0`` a busy worker does not reconnect for every
    claim and an idle one still reconnects on each poll. A positive
    ``CONN_MAX_AGE`` is honoured while busy too, by the connection's age
    alone (no health-check query per claim), and a connection left unused
    (``unused_for``, in seconds) for ``LOOP_RECHECK_AFTER`` seconds or more
    (the loop waited through long jobs) is tested with ``is_usable()`` first:
    a server or proxy idle timeout may have closed it, and a failed claim
    would cost a logged error and a back-off. A connection broken by a
    database error is closed where the error is caught.

    ``keep`` (a wake-up listener runs, decision 84): an ``idle`` poll keeps the
    connection as a busy one would, and still honours ``CONN_HEALTH_CHECKS``
    as Django does before a request: it is tested before the next claim, so
    one ended from outside while the worker waited is replaced, not used
    (decision 173).
    """
    if idle and not keep:
        close_old_connections()
        return
    conn = connections[using]
    recheck = unused_for >= LOOP_RECHECK_AFTER or (
        idle and conn.settings_dict.get("CONN_HEALTH_CHECKS", False)
    )
    if (
        conn.connection is not None
        and not conn.in_atomic_block
        and recheck
        and not conn.is_usable()
    ):
        # Unused for a while (a long job, an idle wait): a server or proxy idle timeout, or
        # an operator, may have closed it.
        conn.close()
        return
    if (
        conn.connection is not None
        and conn.settings_dict["CONN_MAX_AGE"]  # 0 means: close when idle (above)
        and conn.close_at is not None
        and time.monotonic() >= conn.close_at
        and not conn.in_atomic_block
    ):
        conn.close()


__all__ = ["LOOP_RECHECK_AFTER", "close_dropped_connections", "upkeep_loop_connection"]
