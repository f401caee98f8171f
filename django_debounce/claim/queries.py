"""The claim's queries: what may be claimed, and the statements a claim runs (contract §4.5, §6, §7).

:func:`claimable_jobs` is the source of truth for which jobs a worker may take;
:class:`ClaimShape` turns it into the claim's locked, peeked or id-restricted
forms. Each statement is compiled to SQL once per shape and alias and run
again with new values (:mod:`django_debounce.compiled`): a worker claims
thousands of times with only the clock and the ids changing.

On PostgreSQL a plain claim (no gated task, no CoDel queue served, not inside
an atomic block) is the claim query and the marking ``UPDATE`` as ONE
autocommit statement (:func:`claim_in_one_statement`: ``WITH picked (… FOR
UPDATE SKIP LOCKED) UPDATE … RETURNING``): one round trip instead of four. If
a picked job has expired it claims nothing and the transactional claim runs,
which expires it (decision 67 in docs/decisions.md).

The transaction around these statements is :mod:`django_debounce.claim.claiming`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import connections
from django.db.models import F, QuerySet
from django.db.models.sql.query import Query
from django.utils import timezone

from .. import compiled
from ..conf import settings
from ..flow.rules import claimable_jobs
from ..models import Job
from .executors import ANY_TASK, ExecutorTaskFilter

Status = Job.Status


@dataclass
class ClaimedBatch:
    """What one claim took: the jobs, and what putting them back needs to undo it."""

    jobs: list[Job] = field(default_factory=list)
    """The claimed jobs as after the claim, in claim order."""
    started_before: dict[int, datetime | None] = field(default_factory=dict)
    """Each claimed job's ``started_at`` from before the claim, by id."""


NOW_SLOT = {"now": Job._meta.get_field("run_at")}


@dataclass(frozen=True)
class ClaimShape:
    """What a claim's SQL depends on besides ``now``, the alias and the limit (a cache key)."""

    queues: tuple[str, ...]
    """Queues served; empty: all."""
    busy: tuple[str, ...]
    """CoDel queues left out of this round (sorted)."""
    lock: str
    """``"skip_locked"``, ``"for_update"`` or ``""`` (the database has no row locks)."""
    tasks: ExecutorTaskFilter = ANY_TASK
    """The task names the claiming executor takes (:func:`~django_debounce.claim.executors.claim_filter`)."""

    def queryset(self, now: datetime, using: str) -> QuerySet[Job]:
        """Return the claim's locked queryset at ``now`` (:func:`claimable_jobs` and this shape)."""
        qs = tasks_of(claimable_jobs(now, self.queues).using(using), self.tasks)
        if self.busy:
            qs = qs.exclude(queue__in=list(self.busy))
        if self.lock == "skip_locked":
            qs = qs.select_for_update(skip_locked=True)
        elif self.lock == "for_update":
            qs = qs.select_for_update()
        return qs


@cache
def _mark_running_slots(count: int) -> dict[str, Any]:
    get = Job._meta.get_field
    return {
        **{f"id{i}": Job._meta.pk for i in range(count)},
        "worker_id": get("worker_id"),
        "now": get("started_at"),
        "lease_until": get("lease_expires_at"),
    }


def mark_running(
    ids: list[int], *, worker_id: str, now: datetime, lease_until: datetime, using: str
) -> int:
    """Mark the READY jobs ``ids`` RUNNING for ``worker_id``; return how many were.

    One ``UPDATE`` that closes each job's window, sets the lease until
    ``lease_until`` and counts the attempt, compiled once per number of ids
    and alias (:mod:`django_debounce.compiled`).
    """
    count = len(ids)

    def build(slot: Mapping[str, Any]) -> Query:
        return compiled.update_query(
            Job.objects.using(using).filter(
                pk__in=[slot[f"id{i}"] for i in range(count)], status=Status.READY
            ),
            status=Status.RUNNING,
            window_key=None,
            worker_id=slot["worker_id"],
            started_at=slot["now"],
            lease_expires_at=slot["lease_until"],
            attempts=F("attempts") + 1,
        )

    entry = compiled.compiled(("mark_running", count), build, _mark_running_slots(count), using)
    values: dict[str, Any] = {f"id{i}": pk for i, pk in enumerate(ids)}
    values.update(worker_id=worker_id, now=now, lease_until=lease_until)
    return compiled.execute_update(entry, values, using)


def tasks_of(qs: QuerySet[Job], tasks: ExecutorTaskFilter) -> QuerySet[Job]:
    """Return ``qs`` restricted to the task names ``tasks`` lets through (issue #10)."""
    if tasks.only is not None:
        qs = qs.filter(task_name__in=list(tasks.only))
    if tasks.skip:
        qs = qs.exclude(task_name__in=list(tasks.skip))
    return qs


def anything_claimable(
    now: datetime, queues: Sequence[str] | None, using: str, tasks: ExecutorTaskFilter = ANY_TASK
) -> bool:
    """Return True when :func:`claimable_jobs` at ``now`` has a row of ``tasks`` (no lock taken).

    The ``exists()`` query is compiled once per (queues, tasks, alias) and reused
    (:mod:`django_debounce.compiled`): an idle worker peeks on every poll.
    """
    shape = tuple(queues or ())
    entry = compiled.compiled(
        ("peek", shape, tasks),
        lambda slot: tasks_of(
            claimable_jobs(slot["now"], shape).using(using), tasks
        ).query.exists(),
        NOW_SLOT,
        using,
    )
    return compiled.has_rows(entry, {"now": now}, using)


@cache
def _lock_due_slots(count: int) -> dict[str, Any]:
    return {**{f"id{i}": Job._meta.pk for i in range(count)}, **NOW_SLOT}


def lock_due(shape: ClaimShape, ids: list[int], now: datetime, using: str) -> dict[int, Job]:
    """Lock those of the jobs ``ids`` that are still claimable at ``now``; return them as locked.

    The claim query restricted to ``ids`` (:func:`claimable_jobs`, so a job
    that stopped being due, READY or first of its key since it was read is
    not taken), ``FOR UPDATE SKIP LOCKED`` where the database has it (rows
    another transaction holds are not waited for), in id order; compiled once
    per number of ids (:mod:`django_debounce.compiled`).

    Returns:
        id -> the job as its locked row holds it. A gated claim reads its
        candidates without locks; what it then runs must be these rows, not the
        ones it read: an enqueue may have merged a call or replaced the payload
        in between (issue #17 item 1, decision 146).
    """
    count = len(ids)
    entry = compiled.compiled(
        ("lock_due", shape, count),
        lambda slot: (
            shape.queryset(slot["now"], using)
            .filter(pk__in=[slot[f"id{i}"] for i in range(count)])
            .order_by("pk")
            .query
        ),
        _lock_due_slots(count),
        using,
    )
    values: dict[str, Any] = {f"id{i}": pk for i, pk in enumerate(ids)}
    values["now"] = now
    return {job.pk: job for job in compiled.fetch_jobs(entry, values, using)}


def one_statement_applies(queues: Sequence[str] | None, using: str) -> bool:
    """Return True when a plain claim on ``using`` may be :func:`claim_in_one_statement`.

    Only on PostgreSQL with SKIP LOCKED (the statement is written for it; without
    it the claim keeps its transaction and plain ``FOR UPDATE``), outside any
    atomic block (the statement commits on its own), and when no served queue has
    CoDel (every queue when ``queues`` is empty or None): CoDel reads and sheds
    the candidates before they are marked RUNNING, which needs the transaction.
    The caller checks that no gated task is registered.

    Raises:
        ConfigurationError: ``DEBOUNCE_QUEUES`` is invalid.
    """
    connection = connections[using]
    if (
        connection.vendor != "postgresql"
        or not connection.features.has_select_for_update_skip_locked
        or connection.in_atomic_block
    ):
        return False
    codel = settings.codel
    return not codel or (bool(queues) and not any(queue in codel for queue in queues or ()))


def _one_statement_sql(pick_sql: str, quote: Callable[[str], str]) -> str:
    """Return the one-statement claim around the compiled id query ``pick_sql``.

    ``quote`` quotes a column or table name (``connection.ops.quote_name``). Built
    once per id query and kept by the compiled SQL's one caching rule
    (:func:`compiled.derived_sql`).

    ``picked`` locks the claim's rows (``FOR UPDATE SKIP LOCKED``, in claim
    order, up to the limit) with their ``started_at`` from before the claim;
    ``stale`` counts the picked rows already past their expiry; ``claimed``
    marks the picked rows RUNNING only if none is stale, so the caller can
    fall back to the transaction that expires them (an expired job never
    runs, §6). Each row is ``(stale count, started_at before the claim, the
    job's columns…)``; the outer ``LEFT JOIN`` returns one row even when
    nothing was claimed: ``(stale count, NULL, NULL, …)``.

    Parameters, in order: the pick query's own, then ``now`` (expiry), the
    RUNNING status, worker id, ``now`` (started_at), the lease's end, the READY
    status.
    """
    return compiled.derived_sql(
        ("claim_oneshot", pick_sql), lambda: _write_one_statement_sql(pick_sql, quote)
    )


def _write_one_statement_sql(pick_sql: str, quote: Callable[[str], str]) -> str:
    """Write the SQL :func:`_one_statement_sql` describes (no cache)."""
    meta = Job._meta
    table = quote(meta.db_table)
    columns = {field.name: quote(str(field.column)) for field in meta.concrete_fields}

    def column(name: str) -> str:
        return columns[name]

    returning = ", ".join(f"{table}.{name}" for name in columns.values())
    return (
        f"WITH picked (pk, expires_at, started_before) AS ({pick_sql}), "
        "stale AS (SELECT count(*) AS n FROM picked WHERE picked.expires_at <= %s), "
        f"claimed AS (UPDATE {table} SET {column('status')} = %s, {column('window_key')} = NULL, "
        f"{column('worker_id')} = %s, {column('started_at')} = %s, "
        f"{column('lease_expires_at')} = %s, "
        f"{column('attempts')} = {table}.{column('attempts')} + 1 "
        f"FROM picked, stale WHERE {table}.{column('id')} = picked.pk "
        f"AND stale.n = 0 AND {table}.{column('status')} = %s "
        f"RETURNING picked.started_before, {returning}) "
        "SELECT stale.n, claimed.* FROM stale LEFT JOIN claimed ON TRUE"
    )


def claim_in_one_statement(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None,
    using: str,
    tasks: ExecutorTaskFilter = ANY_TASK,
) -> ClaimedBatch | None:
    """Claim up to ``limit`` due jobs in ONE autocommit statement (PostgreSQL, decision 67).

    The rows are chosen by the compiled claim query (:func:`claimable_jobs`
    through :class:`ClaimShape`, ``FOR UPDATE SKIP LOCKED``, its ids and
    expiries) and marked RUNNING by the same statement, as ``mark_running``
    would: one round trip instead of BEGIN, SELECT, UPDATE, COMMIT.

    Args:
        worker_id: the claiming worker's id.
        limit: most jobs to claim, >= 1.
        lease: how long the claim's lease lasts from the claim's ``now``.
        queues: queues served; empty or None: all.
        using: database alias (PostgreSQL, autocommit).
        tasks: the task names the claiming executor takes.

    Returns:
        The claim: the jobs as stored after it, in claim order (priority
        descending, then ``run_at``, then id), with each one's ``started_at``
        from before it; or None, claiming nothing, when a picked job is past
        its expiry: the caller's transactional claim must expire it together
        with cancelling its dependents (§6, §11).

    Raises:
        DatabaseError: the statement failed (nothing was claimed).
    """
    connection = connections[using]
    shape = ClaimShape(queues=tuple(queues or ()), busy=(), lock="skip_locked", tasks=tasks)
    entry = compiled.compiled(
        ("claim_oneshot", shape, limit),
        lambda slot: (
            shape.queryset(slot["now"], using)[:limit]
            .values_list("pk", "expires_at", "started_at")
            .query
        ),
        NOW_SLOT,
        using,
    )
    sql = _one_statement_sql(entry.sql, connection.ops.quote_name)
    now = timezone.now()
    when = Job._meta.get_field("started_at").get_db_prep_save(now, connection)
    lease_until = Job._meta.get_field("lease_expires_at").get_db_prep_save(now + lease, connection)
    params = [
        *entry.bind(connection, {"now": now}),
        when,
        Status.RUNNING.value,
        worker_id,
        when,
        lease_until,
        Status.READY.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if rows[0][0]:
        return None
    claim = ClaimedBatch()
    for row in rows:
        if row[2] is None:  # the LEFT JOIN's row when nothing was claimed
            continue
        job = compiled.job_from_row(row[2:], using)
        claim.jobs.append(job)
        claim.started_before[job.pk] = row[1]  # psycopg's aware datetime, as the ORM's
    # RETURNING has no order: put them back in claim order.
    claim.jobs.sort(key=lambda job: (-job.priority, job.run_at, job.pk))
    return claim


__all__ = [
    "NOW_SLOT",
    "ClaimShape",
    "ClaimedBatch",
    "anything_claimable",
    "claim_in_one_statement",
    "lock_due",
    "mark_running",
    "one_statement_applies",
    "tasks_of",
]
