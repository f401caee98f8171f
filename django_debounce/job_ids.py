"""The one guard on row ids coming from outside (admin search terms, action ids, ``depends_on``).

``Job`` and ``DeadLetter`` ids are ``BigAutoField``s: signed 64-bit integers,
always positive. An id outside that range names no row, and some drivers
cannot even bind it (SQLite raises ``OverflowError``), so callers drop such
ids before they reach a query instead of catching the driver's error.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The largest value of a ``BigAutoField`` (PostgreSQL ``bigint``, MariaDB ``BIGINT``, SQLite ``INTEGER``).
MAX_ID = 2**63 - 1


def is_storable_id(pk: int) -> bool:
    """Return True when ``pk`` can be a row id: ``1 <= pk <= 2**63 - 1``."""
    return 0 < pk <= MAX_ID


def storable_ids(ids: Iterable[int]) -> list[int]:
    """Return the ids of ``ids`` that can name a row (:func:`is_storable_id`), in their order.

    The others name no row: leave them out of ``pk__in`` (they would fail to bind).
    """
    return [pk for pk in ids if 0 < pk <= MAX_ID]


__all__ = ["MAX_ID", "is_storable_id", "storable_ids"]
