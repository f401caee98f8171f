"""The hand-off to another executor: claim for it, and take a handed-off job by id (issue #10).

The Celery executor keeps every decision in the database: a scheduler claims
due jobs exactly as the built-in worker does (:func:`claim_for_handoff` is
:func:`~django_debounce.claim.claiming.claim_batch`, so rate limits, concurrency caps,
breakers, CoDel, dependencies and non-overlap per key hold) and marks them
RUNNING under a *hand-off lease*, with a ``worker_id`` starting with
:data:`~django_debounce.run.leases.HANDOFF_PREFIX`: "handed off, not started"
(decision 87). The Celery task then :func:`take` s its job in one conditional
``UPDATE``: only a job still handed off (nobody took it) whose hand-off lease
is live becomes its own, with a fresh lease and ``started_at``; every other
message is a no-op. From there the run is the built-in worker's: the outcome
is fenced on (worker id, attempt) like any run (§11).

A hand-off nobody takes (a failed publish, a lost message, a message that
waited longer than the lease) lapses, and
:func:`~django_debounce.run.leases.reclaim_expired_leases` puts the job back to
READY without counting an attempt (decision 88); the next claim hands it off
again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from ... import compiled
from ...claim.claiming import claim_batch
from ...claim.queries import ClaimedBatch
from ...models import Job
from ...run.leases import HANDOFF_PREFIX

logger = logging.getLogger("django_debounce.celery")

Status = Job.Status

#: Claims a scheduler makes in a row when each loses to lock contention (as the worker's).
CLAIM_ATTEMPTS = 5


def handoff_worker_id(scheduler_id: str) -> str:
    """Return the ``Job.worker_id`` a scheduler's hand-off claims write: the prefix and its id."""
    return f"{HANDOFF_PREFIX}{scheduler_id}"[:255]


def claim_for_handoff(
    *,
    scheduler_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
    peek: bool = True,
) -> list[Job]:
    """Claim up to ``limit`` due jobs of Celery-executor tasks for a hand-off (issue #10).

    The claim is the built-in worker's (:func:`~django_debounce.claim.claiming.claim_batch`
    with ``executor="celery"``): same order, same flow control, same
    non-overlap per key; the claimed jobs are RUNNING (attempt counted, window
    closed) under ``lease``, with ``worker_id`` = :func:`handoff_worker_id`.
    The claim has committed when this returns: publish after it, never inside
    a transaction of the caller's.

    Args:
        scheduler_id: the scheduler's identity (host:pid:random).
        limit: most jobs to claim.
        lease: the hand-off lease: how long a job may wait to be taken.
        queues: debounce queues to claim from; ``None`` or empty: all.
        using: database alias.
        peek: look (without locks) before the locking claim.

    Returns:
        The claimed jobs, in claim order.

    Raises:
        OperationalError: the claim kept losing to lock contention, or the
            database is unreachable (nothing claimed).
    """
    return claim_handoff_batch(
        scheduler_id=scheduler_id, limit=limit, lease=lease, queues=queues, using=using, peek=peek
    ).jobs


def claim_handoff_batch(
    *,
    scheduler_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
    peek: bool = True,
) -> ClaimedBatch:
    """Claim as :func:`claim_for_handoff`; also return each job's ``started_at`` before the claim.

    What the dispatcher needs to put back, as before their claim, the jobs a stop left
    unpublished (:func:`~django_debounce.run.leases.release_unstarted`, decision 169).
    """
    return claim_batch(
        worker_id=handoff_worker_id(scheduler_id),
        limit=limit,
        lease=lease,
        queues=queues,
        using=using,
        peek=peek,
        attempts=CLAIM_ATTEMPTS,
        executor="celery",
    )


@dataclass(frozen=True)
class Taken:
    """What :func:`take` found: the job made this run's, or why the message is a no-op.

    Attributes:
        job: the job, RUNNING for the taker's worker id, or ``None``.
        why: ``""`` when taken; otherwise the reason in operators' words.
    """

    job: Job | None
    why: str = ""


def take(job_id: int, *, worker_id: str, lease: timedelta, using: str = DEFAULT_DB_ALIAS) -> Taken:
    """Take the handed-off job ``job_id`` for ``worker_id`` in ONE conditional statement.

    ``UPDATE … SET worker_id, started_at = now, lease_expires_at = now + lease
    WHERE id = job_id AND status = RUNNING AND worker_id LIKE 'handoff:%' AND
    lease_expires_at > now``: only a job handed off and not yet started, whose
    hand-off lease is live, is taken, so of two messages for one job (a
    duplicate, a redelivery, a re-dispatch after a lapse) one runs it. The
    attempt the hand-off claim counted is this run's (its fence, §11). On
    PostgreSQL and SQLite the statement returns the row (``RETURNING``): one
    round trip; elsewhere (MariaDB has no ``UPDATE … RETURNING``) the row is
    read after it. A message with nothing to take reads the row to say why.

    On PostgreSQL, outside a caller's transaction, the take commits with
    ``synchronous_commit = off`` (``SET LOCAL`` in the same round trip): it does
    not wait for its WAL flush, about half a no-op job's database time. A
    server crash can lose only a take, never the outcome after it (the outcome
    commits synchronously, and its flush carries every earlier WAL record), and
    a lost take is a lost message: the hand-off lease lapses, the job is handed
    off again and runs again (§7), and the first run's outcome, fenced on its
    worker id, is discarded (decision 185).

    Args:
        job_id: the job's id (the Celery task id).
        worker_id: the taker's identity, unique per run (the outcome is fenced on it).
        lease: the run's lease (renew it while the job runs).
        using: database alias.

    Returns:
        :class:`Taken`: the job, or ``None`` and why (already taken or run,
        cancelled, expired, back to READY after its hand-off lapsed, gone).
    """
    now = timezone.now()
    connection = connections[using]
    if connection.vendor in ("postgresql", "sqlite"):
        job = _take_returning(job_id, worker_id=worker_id, now=now, until=now + lease, using=using)
        if job is not None:
            return Taken(job)
        return Taken(None, _why_not(Job.objects.using(using).filter(pk=job_id).first()))
    taken = (
        Job.objects.using(using)
        .filter(
            pk=job_id,
            status=Status.RUNNING,
            worker_id__startswith=HANDOFF_PREFIX,
            lease_expires_at__gt=now,
        )
        .update(worker_id=worker_id, started_at=now, lease_expires_at=now + lease)
    )
    found = Job.objects.using(using).filter(pk=job_id).first()
    if taken and found is not None and found.worker_id == worker_id:
        return Taken(found)
    return Taken(None, _why_not(found))


#: Sent before the take in its round trip on PostgreSQL: the take's commit skips the WAL flush.
ASYNC_COMMIT = "SET LOCAL synchronous_commit TO off; "


def _write_take_sql(quote: Callable[[str], str], *, async_commit: bool = False) -> str:
    """Return the take's ``UPDATE … RETURNING`` (every column, in model order).

    ``async_commit`` puts :data:`ASYNC_COMMIT` first: the two statements form one
    implicit transaction (PostgreSQL's simple query protocol), so the setting is
    this take's alone.
    """
    meta = Job._meta
    table = quote(meta.db_table)
    column = {field.name: quote(str(field.column)) for field in meta.concrete_fields}
    returning = ", ".join(column.values())
    return (
        f"{ASYNC_COMMIT if async_commit else ''}UPDATE {table} SET {column['worker_id']} = %s, {column['started_at']} = %s, "
        f"{column['lease_expires_at']} = %s WHERE {column['id']} = %s "
        f"AND {column['status']} = %s AND {column['worker_id']} LIKE %s "
        f"AND {column['lease_expires_at']} > %s RETURNING {returning}"
    )


def _take_returning(
    job_id: int, *, worker_id: str, now: datetime, until: datetime, using: str
) -> Job | None:
    """Run the take as one ``UPDATE … RETURNING``; return the job taken, or ``None``."""
    connection = connections[using]
    when = Job._meta.get_field("started_at").get_db_prep_save(now, connection)
    lease_end = Job._meta.get_field("lease_expires_at").get_db_prep_save(until, connection)
    params = [worker_id, when, lease_end, job_id, Status.RUNNING.value, f"{HANDOFF_PREFIX}%", when]
    async_commit = (
        connection.vendor == "postgresql"
        and not connection.in_atomic_block
        and not connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")
    )
    with connection.cursor() as cursor:
        sql = compiled.derived_sql(
            ("handoff_take", connection.vendor, async_commit),
            lambda: _write_take_sql(connection.ops.quote_name, async_commit=async_commit),
        )
        cursor.execute(sql, params)
        if async_commit and cursor.description is None:
            cursor.nextset()  # psycopg 3 stands on the SET's result first
        row = cursor.fetchone()
    return None if row is None else compiled.job_from_row(row, using)


def _why_not(job: Job | None) -> str:
    """Say why a message found nothing to take (for the no-op's log line)."""
    if job is None:
        return "the job no longer exists"
    if job.status == Status.RUNNING:
        if not job.worker_id.startswith(HANDOFF_PREFIX):
            return f"it is already running on {job.worker_id}"
        return "its hand-off lease lapsed; the scheduler hands it off again"
    if job.status == Status.READY:
        return "it is READY again (its hand-off lapsed); the scheduler hands it off again"
    return f"it is {job.status}"


__all__ = [
    "CLAIM_ATTEMPTS",
    "Taken",
    "claim_for_handoff",
    "claim_handoff_batch",
    "handoff_worker_id",
    "take",
]
