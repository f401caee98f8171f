"""The one guard on row ids coming from outside (admin search terms, Celery messages, ``depends_on``).

``Job`` and ``DeadLetter`` ids are ``BigAutoField``s: signed 64-bit integers,
always positive. An id outside that range names no row, and some drivers
cannot even bind it (SQLite raises ``OverflowError``), so callers drop such
ids before they reach a query instead of catching the driver's error.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The largest value of a ``BigAutoField`` (PostgreSQL ``bigint``, MariaDB ``BIGINT``, SQLite ``INTEGER``).
MAX_ID = 2**63 - 1
#: Digits of :data:`MAX_ID`: a longer decimal is out of range without converting it.
_MAX_DIGITS = len(str(MAX_ID))
_ASCII_DIGITS = frozenset("0123456789")


def is_storable_id(pk: int) -> bool:
    """Return True when ``pk`` can be a row id: ``1 <= pk <= 2**63 - 1``."""
    return 0 < pk <= MAX_ID


def storable_ids(ids: Iterable[int]) -> list[int]:
    """Return the ids of ``ids`` that can name a row (:func:`is_storable_id`), in their order.

    The others name no row: leave them out of ``pk__in`` (they would fail to bind).
    """
    return [pk for pk in ids if 0 < pk <= MAX_ID]


def parse_id(value: object) -> int | None:
    """Return ``value`` as a row id, or ``None`` when it is not one.

    Accepts an ``int`` (not a ``bool``) that :func:`is_storable_id` accepts,
    or a ``str`` of ASCII decimal digits (surrounding whitespace ignored) whose
    value is one. Everything else is ``None``: other Unicode digits (``"²"``
    passes ``str.isdigit()``, and ``int()`` refuses it or reads ``"١"`` as 1),
    signs, a decimal longer than 19 digits (never converted, so a 5,000-digit
    term costs nothing and cannot hit Python's int-string limit), 0 and
    anything above :data:`MAX_ID`. Never raises.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if is_storable_id(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > _MAX_DIGITS or not _ASCII_DIGITS.issuperset(text):
        return None
    pk = int(text)
    return pk if is_storable_id(pk) else None


__all__ = ["MAX_ID", "is_storable_id", "parse_id", "storable_ids"]
