"""Which database errors a later attempt of the same write may not meet (contract §7, §11).

The worker retries an outcome write through a dropped connection or a lock
wait, but not through a refusal of the data, which every attempt would meet
again. :func:`is_transient` tells the two apart by the driver's error code,
not by its message (a server may word its messages in another language).
Lock contention at enqueue and claim (a lost race or a lock wait, worth another try)
is :func:`is_contention`.
:func:`retry_transient` runs a write and retries it through transient errors;
:class:`ReconnectBackoff` is how a long-running loop (the built-in worker's, the
Celery dispatcher's) waits out a database outage between its rounds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django.db import IntegrityError, InterfaceError, OperationalError, connections, transaction

#: The worker's documented logger (docs/reference/commands.md): the retry lines keep its name.
logger = logging.getLogger("django_debounce.worker")

_T = TypeVar("_T")

#: PostgreSQL SQLSTATE classes after which the same write may succeed: connection
#: exception, transaction rollback (serialization failure, deadlock), insufficient
#: resources, operator intervention (a server shutting down), system error.
PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
#: PostgreSQL's ``lock_not_available`` (a lock timeout): transient, though of class 55.
PG_LOCK_NOT_AVAILABLE = "55P03"
#: MySQL/MariaDB error codes after which the same write may succeed: too many
#: connections, server shutdown, lock wait timeout, deadlock, and the client's lost or
#: refused connection (2002, 2003, 2006, 2013, 2055) or idle timeout (4031).
MYSQL_TRANSIENT_CODES = frozenset({1040, 1053, 1205, 1213, 2002, 2003, 2006, 2013, 2055, 4031})


def is_transient(exc: BaseException) -> bool:
    """Return True for an error a later attempt of the same write may not meet.

    A dropped or refused connection, a lock wait, a deadlock, a server
    shutting down: any ``InterfaceError``, and an ``OperationalError`` whose
    driver error is in :data:`PG_TRANSIENT_CLASSES` (or is
    :data:`PG_LOCK_NOT_AVAILABLE`; a psycopg error without SQLSTATE is a lost
    connection), in :data:`MYSQL_TRANSIENT_CODES`, or SQLite's "locked" or
    "busy". Not a refusal of the data (PostgreSQL's "program limit exceeded",
    MySQL's "incorrect string value", a trigger's error), which every attempt
    would meet again: retrying it through a lease would leave the job RUNNING
    until another worker ran it again. Any other exception is not transient;
    an ``OperationalError`` of an unknown driver is.
    """
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    module = type(cause).__module__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate:  # psycopg; an error without SQLSTATE is a lost connection
        return sqlstate[:2] in PG_TRANSIENT_CLASSES or sqlstate == PG_LOCK_NOT_AVAILABLE
    if module.startswith("MySQLdb"):
        code = exc.args[0] if exc.args else None
        return code in MYSQL_TRANSIENT_CODES
    if module == "sqlite3":
        text = str(exc)
        return "locked" in text or "busy" in text
    return True


def retry_transient(write: Callable[[], _T], *, using: str, patience: timedelta) -> _T:
    """Return ``write()`` (an outcome write), retrying it through a lost connection for ``patience``.

    Only transient errors (:func:`is_transient`: a dropped connection, a lock
    wait) are retried, after closing the connection and a growing pause (0.2 s
    doubling, at most 5 s); each retry is logged at WARNING. A ``DataError``, an
    ``IntegrityError`` or a refusal of the data will fail again, so it is
    raised at once. Inside a caller's transaction (an inline ``--burst`` in a
    test) the write runs in a savepoint, so a refused write leaves that
    transaction usable for the fallback write that follows.
    """
    conn = connections[using]
    if conn.in_atomic_block:
        inner = write

        def write() -> _T:
            with transaction.atomic(using=using):
                return inner()

    deadline = time.monotonic() + patience.total_seconds()
    delay = 0.2
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline or conn.in_atomic_block:
                raise
            logger.warning("database error recording a job outcome (%s); retrying", exc)
            conn.close()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class ReconnectBackoff:
    """A loop's pause after a database error in one of its rounds: 1 s, 2 s, … up to 30 s.

    The built-in worker's loop and the Celery dispatcher's loop survive a
    database outage (the server restarted, the connection dropped) the same
    way (docs/reference/commands.md): each failed round is logged at ERROR
    (action ``db_error``) on the loop's own logger, the connection is closed so
    the next round reconnects, and the loop waits a delay that doubles from 1 s
    to at most 30 s; a round that works starts the count again.

    Args:
        where: what failed, as the log line says it (``"the worker loop"``).
        logger: the loop's logger.
        using: the database alias whose connection is closed.
    """

    #: The first delay is FIRST * 2 seconds; it doubles up to MAX_DELAY.
    FIRST = 0.5
    MAX_DELAY = 30.0

    def __init__(self, where: str, *, logger: logging.Logger, using: str) -> None:
        self.where = where
        self.logger = logger
        self.using = using
        self.failures = 0

    def succeeded(self) -> None:
        """A round worked: the next error waits the first delay again."""
        self.failures = 0

    def failed(self, exc: BaseException) -> float:
        """Log ``exc``, close the connection and return the seconds to wait before the next round."""
        self.failures += 1
        delay = min(self.MAX_DELAY, self.FIRST * 2.0 ** min(self.failures, 6))
        self.logger.error(
            "database error in %s (%s); reconnecting in %.1fs",
            self.where,
            exc,
            delay,
            extra={"action": "db_error"},
        )
        connections[self.using].close()
        return delay


__all__ = [
    "MYSQL_TRANSIENT_CODES",
    "PG_LOCK_NOT_AVAILABLE",
    "PG_TRANSIENT_CLASSES",
    "ReconnectBackoff",
    "is_transient",
    "retry_transient",
]


#: SQLSTATEs of lock contention on PostgreSQL: serialization failure, deadlock, lock timeout.
CONTENTION_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: MySQL/MariaDB error codes of lock contention: lock wait timeout (1205), deadlock (1213).
CONTENTION_MYSQL_CODES = frozenset({1205, 1213})


def is_contention(exc: Exception) -> bool:
    """Return True when ``exc`` means "lost a race or waited on a lock" (§4.4), so a retry can help.

    A unique violation on the open-window or unique-lock column (a racing
    producer inserted first), SQLite's "database is locked", PostgreSQL's
    serialization failures, deadlocks and lock timeouts, and MySQL/MariaDB's
    lock wait timeouts (1205) and deadlocks (1213), by their error codes (the
    server may word its messages in another language). Anything else (a
    missing table, a failed check constraint) is a real error and is raised.
    """
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    text = str(exc)
    if isinstance(exc, IntegrityError):
        return "window_key" in text or "unique_lock" in text
    code = exc.args[0] if exc.args else None
    if isinstance(code, int) and not isinstance(code, bool):  # MySQL/MariaDB: (code, message)
        return code in CONTENTION_MYSQL_CODES
    if sqlstate is not None:
        return sqlstate in CONTENTION_SQLSTATES
    return "locked" in text or "busy" in text or "deadlock" in text.lower()
