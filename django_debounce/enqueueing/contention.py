"""What an enqueue does after a lost race or a lock wait: retry, or give up (contract §4.4).

Shared by the single call (:func:`django_debounce.enqueueing.call.write`) and the
bulk path (:mod:`django_debounce.enqueueing.bulk`), so both retry and give up
alike and raise the same messages.
"""

from __future__ import annotations

import logging
import random
import time

from django.db import IntegrityError, OperationalError, transaction

from ..db_errors import is_contention
from ..exceptions import EnqueueContentionError

#: The logger keeps the name of the enqueue's (``core``): docs/reference/commands.md names it.
logger = logging.getLogger("django_debounce.core")


def contended(
    exc: IntegrityError | OperationalError, what: str, writer: str, db: str, attempt: int
) -> Exception:
    """Decide what a write that failed with ``exc`` does next (§4.4); return ``exc`` to retry.

    Sleeps before a retry (the first is immediate: a lost insert race resolves
    at once). ``what`` names the enqueue and ``writer`` what wrote nothing
    (e.g. ``"this call"``), for the messages.

    Raises:
        IntegrityError, OperationalError: ``exc`` itself, when it is not contention.
        EnqueueContentionError: a lost race at REPEATABLE READ/SERIALIZABLE, or
            lock contention inside the caller's transaction: no retry can help.
    """
    if not is_contention(exc):
        raise exc
    if isinstance(exc, IntegrityError) and _snapshot_is_fixed(db):
        # The winner committed after this transaction's snapshot: no retry inside
        # the transaction can ever see its row, so each would lose again.
        raise EnqueueContentionError(
            f"{what} lost a race to a job another transaction "
            "committed after this transaction began, and this transaction runs at "
            "REPEATABLE READ or SERIALIZABLE, so it can never see that job; nothing "
            f"was written by {writer}. Roll the transaction back and retry it, or "
            "enqueue at READ COMMITTED (the isolation level the package documents)."
        ) from exc
    if isinstance(exc, OperationalError) and transaction.get_connection(db).in_atomic_block:
        # A deadlock or lock timeout inside the caller's transaction: the caller
        # still holds its locks, so retrying in a savepoint would only wait again.
        raise EnqueueContentionError(
            f"{what} hit lock contention inside the caller's "
            f"transaction ({exc}); nothing was written by {writer}. Roll the "
            "transaction back and retry it."
        ) from exc
    logger.debug(
        "%s lost a race or waited on a lock (attempt %d): %s",
        what,
        attempt + 1,
        exc,
        extra={"action": "enqueue_retry"},
    )
    if attempt:  # the first retry is immediate: a lost insert race resolves at once
        time.sleep(min(0.5, 0.002 * 2**attempt) * random.random())
    return exc


def _snapshot_is_fixed(db: str) -> bool:
    """Return True inside a PostgreSQL transaction whose snapshot does not move.

    At REPEATABLE READ or SERIALIZABLE a transaction sees the rows committed
    before its first statement and no others; its locking reads too, so a row
    that won a race after that can never be found and slid or coalesced.
    Asked only after a lost race inside an atomic block (one ``SHOW``), never
    on the path of a call that wins. On MySQL/MariaDB a locking read sees the
    latest committed row at any level; SQLite serialises writers.
    """
    conn = transaction.get_connection(db)
    if conn.vendor != "postgresql" or not conn.in_atomic_block:
        return False
    with conn.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        row = cursor.fetchone()
    return row is not None and row[0] in ("repeatable read", "serializable")
