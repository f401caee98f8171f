"""The claim: take due jobs for a worker, in one short transaction (contract §4.5, §6, §7, §11).

:func:`claim_jobs` is what an executor calls to claim. One short transaction
selects up to ``limit`` due jobs with ``SELECT … FOR UPDATE SKIP LOCKED``
(plain ``FOR UPDATE`` where the database lacks SKIP LOCKED; SQLite serialises
writers with its ``IMMEDIATE`` transactions), ordered by priority (higher
first), then ``run_at``, then id, and marks them RUNNING in one ``UPDATE``:
that closes each job's window (``window_key = NULL``), sets the lease and
counts the attempt. A job is left out while another job of its debounce key is
RUNNING under a live lease or is due earlier, so runs of one key never overlap
(§4.5). A claimed job past its expiry is ended EXPIRED instead
(:func:`~django_debounce.claim.expiry.expire_jobs`). Tasks run outside any
transaction; their outcome is written by :mod:`django_debounce.run.outcomes`.

Which jobs may be claimed and the compiled statements are
:mod:`django_debounce.claim.queries` (with the one-statement claim PostgreSQL
uses when no gated task is registered and no CoDel queue is served);
flow control is :mod:`django_debounce.flow.admission` and :mod:`django_debounce.flow.codel`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction
from django.utils import timezone

from .. import compiled, tracing
from ..conf import settings
from ..db_errors import is_contention
from ..flow.codel import apply_codel
from ..flow.redis_tokens import TokenLedger
from ..flow.rules import claimable_jobs, current_gates
from ..flow.start_rules import cut_for_start, judged_at_start
from ..log_fields import job_fields
from ..models import Job
from .executors import ExecutorTaskFilter, claim_filter
from .expiry import expire_jobs
from .gated import take_admitted
from .queries import (
    NOW_SLOT,
    ClaimedBatch,
    ClaimShape,
    anything_claimable,
    claim_in_one_statement,
    mark_running,
    one_statement_applies,
)
from .task_states import ensure_task_states

#: The worker's documented logger (docs/reference/commands.md): claim lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status


def claim_jobs(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
    peek: bool = False,
    executor: str = "worker",
    start_now: int | None = None,
) -> list[Job]:
    """Claim up to ``limit`` due jobs for ``worker_id`` in one transaction.

    With ``peek``, first look (without locks) whether anything is claimable and
    return ``[]`` at once if not: cheaper for a worker that expects an idle queue.

    Flow control (§6): when a registered task has a rate limit, a concurrency
    cap or a circuit breaker, the due jobs pass :mod:`django_debounce.flow.admission`
    in this same transaction (the tasks' TaskState rows locked), so the limits
    hold across every worker; jobs held back stay READY with their ``run_at``
    and ``on_excess="drop"`` jobs without a token are shed. Only the jobs the
    claim takes are locked (``_take_admitted``), so a concurrent claim
    finds the others. With no gated task registered the claim runs exactly as
    without flow control (no extra query).

    On PostgreSQL, with no gated task, no CoDel queue served and no atomic block
    around the call, the claim is one autocommit statement
    (:func:`~django_debounce.claim.queries.claim_in_one_statement`).

    Args:
        worker_id: the identity written on the claimed jobs (``Job.worker_id``);
            their outcome writes are fenced on it (§11).
        limit: most jobs to claim; 0 or less claims nothing (no query).
        lease: how long each claimed job is held, from the claim's ``now``,
            before another worker may reclaim it (renew it while it runs).
        queues: queue names to claim from; ``None`` or empty: every queue.
        using: database alias.
        peek: look before locking, as above.
        executor: ``"worker"`` or ``"celery"``: claim only jobs of the tasks
            that executor runs (:func:`~django_debounce.claim.executors.claim_filter`,
            issue #10); with every task on ``DEBOUNCE_EXECUTOR`` that is every job.
        start_now: how many of the claimed jobs the caller starts at once (its
            free threads); the rest wait in the caller (claimed ahead). ``None``:
            every job claimed starts at once. A job under a rule judged at its
            start (a gated task, a CoDel queue) is taken only among the first
            ``start_now``, and the claim takes nothing past the first such job
            it cannot start (:mod:`django_debounce.flow.start_rules`, decision 146).

    Returns:
        The claimed jobs as they are after the claim (RUNNING, attempts
        counted, lease set), in claim order.

    Raises:
        OperationalError: the claim lost a deadlock or a lock wait and was
            rolled back whole, nothing claimed
            (:func:`~django_debounce.db_errors.is_contention`; claiming again is safe),
            or the database is unreachable.
        ConfigurationError: ``DEBOUNCE_QUEUES`` is invalid.
    """
    return claim_batch(
        worker_id=worker_id,
        limit=limit,
        lease=lease,
        queues=queues,
        using=using,
        peek=peek,
        executor=executor,
        start_now=start_now,
    ).jobs


def claim_batch(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
    peek: bool = False,
    attempts: int = 1,
    executor: str = "worker",
    start_now: int | None = None,
) -> ClaimedBatch:
    """Claim as :func:`claim_jobs` does; return the jobs with their ``started_at`` before the claim.

    For an executor that may have to put claimed jobs back unstarted
    (:func:`~django_debounce.run.leases.release_unstarted` needs
    :attr:`ClaimedBatch.started_before`); otherwise call :func:`claim_jobs`.

    ``attempts`` (≥ 1) is how many claims to make in a row when each loses a
    deadlock or a lock wait (:func:`~django_debounce.db_errors.is_contention`, as on
    the enqueue side, §4.4: e.g. MariaDB's deadlock 1213), which rolled the
    claim back whole: the next one is made at once, later ones after a short
    random pause, each logged at DEBUG (action ``claim_retry``). Inside a
    caller's transaction contention is raised at once: the server rolled that
    transaction back too. The other arguments and the errors are those of
    :func:`claim_jobs`.
    """
    tasks = claim_filter(executor)
    if tasks.takes_nothing:  # no task of this process runs on ``executor``
        return ClaimedBatch()
    tracer = tracing.tracer()  # a claim that took jobs is a span (decision 213)
    began = time.time_ns() if tracer is not None else 0
    batch = _claim_retrying(
        worker_id=worker_id,
        limit=limit,
        lease=lease,
        queues=queues,
        using=using,
        peek=peek,
        tasks=tasks,
        start_now=start_now,
        attempts=attempts,
    )
    if tracer is not None and batch.jobs:
        from ..tracing.spans import record_claim

        record_claim(tracer, began, batch.jobs, queues, executor)
    return batch


def _claim_retrying(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None,
    using: str,
    peek: bool,
    tasks: ExecutorTaskFilter,
    start_now: int | None,
    attempts: int,
) -> ClaimedBatch:
    """Claim as :func:`claim_batch` says, up to ``attempts`` times under lock contention."""
    attempt = 1
    while True:
        try:
            return _claim_once(
                worker_id=worker_id,
                limit=limit,
                lease=lease,
                queues=queues,
                using=using,
                peek=peek,
                tasks=tasks,
                start_now=start_now,
            )
        except OperationalError as exc:
            if attempt >= attempts or not is_contention(exc) or connections[using].in_atomic_block:
                raise
            logger.debug(
                "claim lost a deadlock or waited on a lock (attempt %d): %s; claiming again",
                attempt,
                exc,
                extra={"action": "claim_retry"},
            )
            if attempt > 1:  # the first retry is immediate, as on the enqueue side
                time.sleep(min(0.5, 0.002 * 2**attempt) * random.random())
            attempt += 1


def _claim_once(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None,
    using: str,
    peek: bool,
    tasks: ExecutorTaskFilter,
    start_now: int | None = None,
) -> ClaimedBatch:
    """Make one claim as :func:`claim_jobs` describes it, of the task names ``tasks`` lets through."""
    if limit <= 0:
        return ClaimedBatch()
    queues = list(queues) if queues is not None else None  # read more than once below
    features = connections[using].features
    if peek and not anything_claimable(timezone.now(), queues, using, tasks):
        # Nothing due: answer without a locking transaction (on SQLite an IMMEDIATE
        # transaction takes the database's write lock and would stall producers).
        return ClaimedBatch()
    gates = current_gates()  # pure Python; empty: the fast path
    if gates:
        ensure_task_states(gates, using)  # before the transaction: a claim never inserts them
    if not gates and one_statement_applies(queues, using):
        claimed = claim_in_one_statement(
            worker_id=worker_id, limit=limit, lease=lease, queues=queues, using=using, tasks=tasks
        )
        if claimed is not None:
            return claimed
        # An expired job was among the picked ones: the transaction below expires it (and
        # cancels its dependents with it) and claims the rest.
    judged = judged_at_start(gates, settings.codel)
    busy: set[str] = set()  # CoDel queues whose state row another claim holds right now
    while True:
        # The ledger gives back the Redis tokens (DEBOUNCE_REDIS) of a round that rolls back,
        # its commit included (decision 101).
        with TokenLedger() as ledger, transaction.atomic(using=using):
            now = timezone.now()
            shape = ClaimShape(
                queues=tuple(queues or ()),
                busy=tuple(sorted(busy)),
                lock=(
                    "skip_locked"
                    if features.has_select_for_update_skip_locked
                    else "for_update"
                    if features.has_select_for_update
                    else ""
                ),
                tasks=tasks,
            )
            if gates:
                jobs = take_admitted(
                    shape,
                    gates,
                    limit=limit,
                    now=now,
                    using=using,
                    ledger=ledger,
                    start_now=start_now,
                    judged=judged,
                )
            else:
                jobs = _take_due(shape, limit=limit, now=now, using=using)
                jobs = cut_for_start(jobs, start_now, judged)
            # CoDel (§6): shed what each queue's control law drops (no query unless a candidate's
            # queue has CoDel). If it shed every candidate, commit that and claim again in a new
            # transaction (each round sheds a job; QueueState locks are taken last, see codel.py).
            # A queue whose state row another claim holds is left out of the next round, so a
            # claimer stalled in its claim never stalls this one (each round sheds a job or
            # finds one more busy queue, so the loop ends).
            seen_busy = len(busy)
            kept = apply_codel(jobs, now=now, using=using, busy=busy)
            if jobs and not kept:
                if len(busy) > seen_busy or any(job.status == Status.SHED for job in jobs):
                    continue
            jobs = kept
            if not jobs:
                return ClaimedBatch()
            ids = [job.pk for job in jobs]
            lease_until = now + lease
            updated = mark_running(
                ids, worker_id=worker_id, now=now, lease_until=lease_until, using=using
            )
            if updated != len(jobs):  # a database without row locks let another worker win some
                mine = set(
                    Job.objects.using(using)
                    .filter(pk__in=ids, status=Status.RUNNING, worker_id=worker_id, started_at=now)
                    .values_list("pk", flat=True)
                )
                jobs = [job for job in jobs if job.pk in mine]
        break
    claim = ClaimedBatch(jobs=jobs, started_before={job.pk: job.started_at for job in jobs})
    for job in jobs:
        job.status = Status.RUNNING
        job.window_key = None
        job.worker_id = worker_id
        job.started_at = now
        job.lease_expires_at = lease_until
        job.attempts += 1
        logger.debug(
            "claimed job %s (%s) for %s",
            job.pk,
            job.task_name,
            worker_id,
            extra=job_fields(job, action="claim", outcome="claimed"),
        )
    return claim


def _take_due(shape: ClaimShape, *, limit: int, now: datetime, using: str) -> list[Job]:
    """Return up to ``limit`` due jobs of ``shape``'s claim query, locked, expiring stale ones.

    The query's SQL is compiled once per (shape, limit, alias) and reused with
    this ``now`` (:mod:`django_debounce.compiled`; docs/decisions.md).
    """
    entry = compiled.compiled(
        ("claim", shape, limit),
        lambda slot: shape.queryset(slot["now"], using)[:limit].query,
        NOW_SLOT,
        using,
    )
    while True:
        jobs = compiled.fetch_jobs(entry, {"now": now}, using)
        if not jobs:
            return []
        expired = [job.pk for job in jobs if job.expires_at is not None and job.expires_at <= now]
        if not expired:
            return jobs
        expire_jobs(expired, now=now, using=using)
        jobs = [job for job in jobs if job.pk not in expired]
        if jobs:
            return jobs


__all__ = ["ClaimedBatch", "claim_batch", "claim_jobs", "claimable_jobs"]
