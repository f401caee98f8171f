"""How much one batched success write may carry, and whether a refusal was the statement's (§7).

:class:`~django_debounce.run.success_batches.SuccessBatch` writes many successes in
one ``UPDATE``; each result's JSON text is in it (twice on the wire once the
client escapes it, at worst). MariaDB and MySQL refuse a statement longer than
the server's ``max_allowed_packet`` (16 MiB by default on MariaDB, 64 MiB on
MySQL 8), and usually drop the connection with it (error 1153, or 2006 "server
has gone away", which also means a lost connection). So a batch is bounded by
bytes as well as rows (:func:`max_batch_bytes`, :func:`entry_bytes`), and after
a failed batch :func:`database_answers` tells an outage (retry the batch) from a
refusal of that statement (split it). Decision 151 in docs/decisions.md.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, transaction

#: Most bytes of result JSON one batched ``UPDATE`` carries (4 MiB, well under MariaDB's
#: default 16 MiB ``max_allowed_packet``); a larger batch is written in several statements.
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Bytes counted for each row beside its result: its id twice, its finish time, the ``CASE``.
ROW_OVERHEAD = 64

#: The ``max_allowed_packet`` assumed without asking (MySQL's smallest default, 1 MiB): a
#: batch of at most a third of it is written without reading the server's.
ASSUMED_PACKET = 1024 * 1024

#: ``@@max_allowed_packet`` of each MariaDB/MySQL alias, read once per process.
_packets: dict[str, int] = {}


def entry_bytes(stored: Any) -> int:
    """Return the bytes (int) ``stored``, a result's JSON form, adds to a batched ``UPDATE``.

    The length of the JSON text Django sends for it (ASCII: a non-ASCII
    character is its 6-byte ``\\uXXXX`` escape) plus :data:`ROW_OVERHEAD`.
    Never raises: a value ``json`` cannot write counts as :data:`MAX_BATCH_BYTES`
    (it is then written alone).
    """
    try:
        return len(json.dumps(stored)) + ROW_OVERHEAD
    except Exception:  # not JSON at all: the write will say so, alone
        return MAX_BATCH_BYTES


def max_batch_bytes(using: str, *, pending: int = MAX_BATCH_BYTES) -> int:
    """Return the byte budget (int) of one batched success write on the database ``using``.

    :data:`MAX_BATCH_BYTES`; on MariaDB/MySQL at most a third of the server's
    ``@@max_allowed_packet`` (the escaped JSON may double, the rest is the
    statement's), read once per alias and process, and only once ``pending``
    (the bytes waiting to be written) exceeds a third of :data:`ASSUMED_PACKET`,
    so a worker of small results never asks. If the variable cannot be read,
    :data:`MAX_BATCH_BYTES` is used and the read is tried again next time.
    Never raises.
    """
    connection = connections[using]
    if connection.vendor != "mysql" or (using not in _packets and pending <= ASSUMED_PACKET // 3):
        return MAX_BATCH_BYTES
    packet = _packets.get(using)
    if packet is None:
        try:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.execute("SELECT @@max_allowed_packet")
                packet = int(cursor.fetchone()[0])
        except (DatabaseError, InterfaceError):
            return MAX_BATCH_BYTES
        _packets[using] = packet
    return max(1, min(MAX_BATCH_BYTES, packet // 3))


def database_answers(using: str) -> bool:
    """After a failed write: return True if the database ``using`` answers a fresh ``SELECT 1``.

    Closes the connection first (a MariaDB that refused a statement as too
    large has dropped it) and opens a new one. True means the failure was the
    statement's (too large, or data it refuses), not an outage. Inside a
    caller's transaction the connection cannot be replaced: True (the failed
    statement ran in a savepoint). Never raises.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        return True
    connection.close()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (DatabaseError, InterfaceError):
        connection.close()
        return False
    return True


__all__ = [
    "ASSUMED_PACKET",
    "MAX_BATCH_BYTES",
    "ROW_OVERHEAD",
    "database_answers",
    "entry_bytes",
    "max_batch_bytes",
]
