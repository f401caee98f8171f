"""Operators' actions run again after a deadlock or a lock wait (§4.4; decisions 172, 210).

MariaDB/MySQL lock an index record before its row, so an enqueue (which finds a
window through ``window_key``), a claim (which finds it through the claim index)
and a flush or cancel can take one job's locks in opposite orders; the one the
server picks as a deadlock's victim has lost nothing but its transaction, which
:func:`retrying` runs again. Inside the caller's transaction nothing is retried:
the deadlock rolled that transaction back.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, transaction

from ..db_errors import is_contention
from ..exceptions import DebounceError

logger = logging.getLogger("django_debounce.windows")

#: Attempts of an action that meets lock contention (outside a caller's transaction).
ATTEMPTS = 8
_T = TypeVar("_T")


def retrying(attempt: Callable[[], _T], db: str, what: str, error: type[DebounceError]) -> _T:
    """Return ``attempt()``, run again after a deadlock or lock wait, up to :data:`ATTEMPTS` times.

    Args:
        attempt: runs the action in its own transaction on ``db``.
        db: the database alias.
        what: the action, for messages (``"window flush"``, ``"cancel"``).
        error: the package's exception to raise when it gives up.

    Raises:
        error: the attempts ran out, or contention inside the caller's
            transaction; nothing was changed.
    """
    last: Exception | None = None
    for number in range(ATTEMPTS):
        try:
            return attempt()
        except OperationalError as exc:
            if not is_contention(exc):
                raise
            last = exc
            if transaction.get_connection(db).in_atomic_block:
                raise error(
                    f"{what} hit lock contention inside the caller's transaction ({exc}); "
                    "nothing was changed. Roll the transaction back and retry it."
                ) from exc
            logger.debug(
                "%s met lock contention (attempt %d): %s",
                what,
                number + 1,
                exc,
                extra={"action": "window_retry"},
            )
            time.sleep(min(0.5, 0.002 * 2**number) * random.random())
    raise error(
        f"{what} gave up after {ATTEMPTS} attempts under lock contention; nothing was "
        "changed. Retry it."
    ) from last


__all__ = ["ATTEMPTS", "retrying"]
