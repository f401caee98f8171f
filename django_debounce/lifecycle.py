"""Terminal transitions of a job, each in one place (contract §6, §8, §11).

A job ends in one of five ways, and each has one function here:

* :func:`succeed`: RUNNING → SUCCESSFUL (fenced on the run, §11);
* :func:`bury` / :func:`bury_lapsed`: RUNNING → FAILED with a dead letter (§8);
* :func:`shed`: READY → SHED with a dead letter (§6);
* :func:`expire`: READY → EXPIRED, no dead letter (§6, §11);
* :func:`cancel`: READY → CANCELLED, no dead letter (§4.1, §6).

Every one sets ``status`` and ``finished_at`` and clears the columns that only
a live job may hold (``window_key``, ``unique_lock``, and the lease of a
RUNNING job): the database refuses a finished row that keeps them
(``debounce_job_window_only_ready``, ``debounce_job_lock_only_live``). Every
end but a success cancels the job's READY dependents, transitively, in the
same transaction (:func:`cancel_dependents`, §6). A dead letter is built in
one place, :func:`new_dead_letter`, which also sets its ``kind``.

These functions write; they send no signal and count nothing in a circuit
breaker: the caller (the worker's outcome code, the enqueue path, the admin's
operations) does that, as the contract says for its case (§9).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from . import compiled
from .dead_letter_kinds import SHED_KINDS
from .log_fields import job_fields, jobs_fields
from .models import DeadLetter, Job, JobDependency
from .signals import _job_shed, send_signal

logger = logging.getLogger("django_debounce.lifecycle")

Status = Job.Status

#: Terminal statuses that cancel a job's dependents (§6).
CANCELLING_STATUSES = frozenset({Status.FAILED, Status.SHED, Status.CANCELLED, Status.EXPIRED})


def _ended(status: str, now: datetime) -> dict[str, Any]:
    """Return the columns every terminal write sets: status, ``finished_at``, no window or lock."""
    return {"status": status, "finished_at": now, "window_key": None, "unique_lock": None}


def new_dead_letter(
    job: Job,
    *,
    reason: str,
    metadata: dict[str, Any],
    now: datetime,
    error: str = "",
    tb: str = "",
    using: str = DEFAULT_DB_ALIAS,
) -> DeadLetter:
    """Build (unsaved) the dead letter of ``job``: the one place a dead-letter row is made (§8).

    The entry copies what a retry needs (task name, queue, args, kwargs),
    takes its ``kind`` from the reason's reserved prefix
    (:meth:`DeadLetter.Kind.of_reason`) and its ``retry_depth`` from the
    chain of retries that led to ``job`` (one query,
    :meth:`DeadLetter.retry_depth_for`). Save it (or ``bulk_create`` several)
    in the transaction that ends the job.

    Args:
        job: the job that ends; its ``task_name``, ``queue``, ``args`` and ``kwargs``
            are copied.
        reason: ``failed: …`` or a reserved prefix (``shed:``, ``codel:``,
            ``unknown_task:``); stored as given.
        metadata: JSON-able details (e.g. ``{"attempts": 4}``).
        now: the entry's ``created_at``, an aware datetime.
        error: the last exception as ``"dotted.Class: message"`` (may be empty).
        tb: its traceback text (may be empty).
        using: database alias of the retry-depth query.
    """
    return DeadLetter(
        job=job,
        task_name=job.task_name,
        queue=job.queue,
        args=job.args,
        kwargs=job.kwargs,
        reason=reason,
        kind=DeadLetter.Kind.of_reason(reason),
        metadata=metadata,
        error=error,
        traceback=tb,
        created_at=now,
        retry_depth=DeadLetter.retry_depth_for(job, using=using),
    )


def cancel_dependents(
    job_ids: Iterable[int], *, now: datetime, using: str = DEFAULT_DB_ALIAS
) -> list[int]:
    """Cancel every READY job that depends, directly or transitively, on ``job_ids``.

    Call it inside the transaction that moved ``job_ids`` to a status in
    :data:`CANCELLING_STATUSES`, so the end and the cancellations commit
    together (every transition here does). A dependent that is already
    RUNNING or finished is left alone (it cannot have started before its
    dependency succeeded, unless it was enqueued with a dependency that had
    already succeeded). Two queries per level of dependents.

    Args:
        job_ids: primary keys of jobs that just ended without success.
        now: the ``finished_at`` written on the cancelled jobs (the package's
            one clock, ``timezone.now()``, §4.7).
        using: database alias.

    Returns:
        The primary keys of the jobs cancelled, breadth first.
    """
    cancelled: list[int] = []
    frontier = list(dict.fromkeys(job_ids))
    seen = set(frontier)
    while frontier:
        waiting = list(
            JobDependency.objects.using(using)
            .filter(dependency_id__in=frontier, job__status=Status.READY)
            .values_list("job_id", flat=True)
            .distinct()
        )
        waiting = [pk for pk in waiting if pk not in seen]
        if not waiting:
            break
        Job.objects.using(using).ready().filter(pk__in=waiting).update(
            **_ended(Status.CANCELLED, now)
        )
        seen.update(waiting)
        cancelled.extend(waiting)
        frontier = waiting
    if cancelled:
        logger.info(
            "cancelled %d job(s) whose dependency did not succeed: %s",
            len(cancelled),
            cancelled,
            extra=jobs_fields(cancelled, action="cancel_dependents", outcome="cancelled"),
        )
    return cancelled


def _end_ready(ids: list[int], status: str, now: datetime, using: str) -> list[int]:
    """End the READY jobs among ``ids`` as ``status`` and cancel their dependents.

    Returns the dependents cancelled. The caller normally holds the rows'
    locks, so every id is READY; if some was not (claimed meanwhile), only
    the jobs that did end have their dependents cancelled (one more query).
    """
    with transaction.atomic(using=using, savepoint=False):
        updated = Job.objects.using(using).ready().filter(pk__in=ids).update(**_ended(status, now))
        if updated != len(set(ids)):
            ids = list(
                Job.objects.using(using)
                .filter(pk__in=ids, status__in=CANCELLING_STATUSES)
                .values_list("pk", flat=True)
            )
        return cancel_dependents(ids, now=now, using=using)


def expire(job_ids: Iterable[int], *, now: datetime, using: str = DEFAULT_DB_ALIAS) -> list[int]:
    """End READY jobs past their expiry as EXPIRED: they never run (§6, §11).

    No dead letter (§8: a planned outcome); their dependents are cancelled in
    the same transaction. Call it where the rows are locked (the claim, the
    enqueue that found a stale window); a job that is no longer READY is left
    alone.

    Args:
        job_ids: primary keys of the jobs to expire.
        now: the ``finished_at`` written, an aware datetime.
        using: database alias.

    Returns:
        The primary keys of the dependents cancelled, breadth first.
    """
    return _end_ready(list(job_ids), Status.EXPIRED, now, using)


def cancel_ready(
    job_ids: Iterable[int], *, now: datetime, using: str = DEFAULT_DB_ALIAS
) -> list[int]:
    """End the READY jobs among ``job_ids`` as CANCELLED: they never run (again) (§4.1, §6).

    The transition under :func:`django_debounce.ops.windows.cancel` (the
    operator's action, which locks the rows and reports) and under an enqueue
    whose dependency had already failed.

    A planned outcome (§8): no dead letter. An open window closes
    (``window_key`` and ``unique_lock`` cleared), so the key's next call
    opens a new window. Dependents are cancelled in the same transaction. A
    job that is no longer READY (claimed meanwhile, or finished) is left alone.

    Args:
        job_ids: primary keys of the jobs to cancel.
        now: the ``finished_at`` written, an aware datetime.
        using: database alias.

    Returns:
        The primary keys of the dependents cancelled, breadth first.
    """
    return _end_ready(list(job_ids), Status.CANCELLED, now, using)


def shed(
    job: Job,
    *,
    reason: str,
    metadata: dict[str, Any],
    now: datetime,
    using: str = DEFAULT_DB_ALIAS,
) -> DeadLetter | None:
    """Mark the READY ``job`` SHED, write its dead letter and cancel its dependents (§6, §8).

    Call it inside the claim transaction that holds the job's row lock. None
    of the lifecycle signals is sent (§9: none for a shed); the observation
    signal ``_job_shed`` is sent once the transaction commits (decision 106).
    On success ``job``'s fields are updated in place.

    Args:
        job: the READY job to drop.
        reason: the dead letter's reason; must start with ``"shed:"`` (a rate
            limit with ``on_excess="drop"``) or ``"codel:"`` (CoDel).
        metadata: the dead letter's metadata; holds ``"shed": True`` or
            ``"codel": True`` to match the prefix (§6).
        now: the time written as ``finished_at`` and the letter's ``created_at``.
        using: database alias.

    Returns:
        The dead letter, or ``None`` when the job was no longer READY (nothing
        written).

    Raises:
        ValueError: ``reason`` lacks a shed prefix (nothing is written).
    """
    if DeadLetter.Kind.of_reason(reason) not in SHED_KINDS:
        raise ValueError(f"a shed reason must start with 'shed:' or 'codel:', got {reason!r}")
    with transaction.atomic(using=using, savepoint=False):
        updated = (
            Job.objects.using(using).ready().filter(pk=job.pk).update(**_ended(Status.SHED, now))
        )
        if not updated:
            return None
        job.status, job.finished_at, job.window_key, job.unique_lock = Status.SHED, now, None, None
        letter = new_dead_letter(job, reason=reason, metadata=metadata, now=now, using=using)
        letter.save(using=using)
        cancel_dependents([job.pk], now=now, using=using)
        transaction.on_commit(
            lambda: send_signal(_job_shed, job=job, dead_letter=letter), using=using
        )
    logger.info(
        "shed job %s (%s): %s",
        job.pk,
        job.task_name,
        reason,
        extra=job_fields(job, action="shed", outcome="shed"),
    )
    return letter


def bury(
    job: Job,
    *,
    worker_id: str,
    reason: str,
    error: str,
    tb: str,
    metadata: dict[str, Any],
    now: datetime,
    using: str = DEFAULT_DB_ALIAS,
) -> DeadLetter | None:
    """Fail ``job``'s run for good and write its dead letter, in one transaction (§8, §11).

    Fenced on the run (:meth:`.JobQuerySet.current_run`): if the job was
    reclaimed or claimed again since ``worker_id`` started this attempt,
    nothing is written. Dependents are cancelled in the same transaction. On
    success ``job``'s fields are updated in place. No signal is sent and the
    circuit breaker is not counted: the caller does both (§6, §9).

    Args:
        job: the RUNNING job, as claimed (its ``attempts`` is the fence).
        worker_id: the worker that runs it.
        reason: ``failed: …`` or ``unknown_task: <name>`` (§8).
        error: ``"dotted.Class: message"`` stored on the job and the letter.
        tb: the traceback text stored on both.
        metadata: the letter's metadata (e.g. ``{"attempts": 4}``).
        now: ``finished_at`` and the letter's ``created_at``, an aware datetime.
        using: database alias.

    Returns:
        The saved dead letter, or ``None`` when the run was no longer current.
    """
    with transaction.atomic(using=using, savepoint=False):
        updated = (
            Job.objects.using(using)
            .current_run(job.pk, attempts=job.attempts, worker_id=worker_id)
            .update(**_ended(Status.FAILED, now), lease_expires_at=None, error=error, traceback=tb)
        )
        if not updated:
            return None
        letter = new_dead_letter(
            job, reason=reason, metadata=metadata, now=now, error=error, tb=tb, using=using
        )
        letter.save(using=using)
        cancel_dependents([job.pk], now=now, using=using)
    job.status, job.finished_at, job.error, job.traceback = Status.FAILED, now, error, tb
    job.lease_expires_at = job.window_key = job.unique_lock = None
    return letter


def bury_lapsed(
    jobs: Sequence[Job], *, error: str, now: datetime, using: str = DEFAULT_DB_ALIAS
) -> list[DeadLetter]:
    """Fail RUNNING jobs whose lease lapsed with every retry used, each with a dead letter (§7, §11).

    A job that kills its workers ends here when a reclaim finds it out of
    retries. Call it in the reclaim transaction that locked the rows. Each
    letter's reason is ``failed: lease expired after N attempt(s); <error>``
    and its metadata ``{"attempts": N, "worker_id": <the lost worker>}``.
    Dependents are cancelled in the same transaction. No signal is sent.

    Args:
        jobs: the locked RUNNING jobs, as read (their ``attempts`` and ``worker_id``).
        error: ``"dotted.Class: message"`` stored on the jobs and letters.
        now: ``finished_at`` and the letters' ``created_at``.
        using: database alias.

    Returns:
        The dead letters written, in the order of ``jobs``.
    """
    if not jobs:
        return []
    with transaction.atomic(using=using, savepoint=False):
        Job.objects.using(using).running().filter(pk__in=[job.pk for job in jobs]).update(
            **_ended(Status.FAILED, now), lease_expires_at=None, error=error
        )
        letters = [
            new_dead_letter(
                job,
                reason=f"failed: lease expired after {job.attempts} attempt(s); {error}",
                metadata={"attempts": job.attempts, "worker_id": job.worker_id},
                now=now,
                error=error,
                using=using,
            )
            for job in jobs
        ]
        DeadLetter.objects.using(using).bulk_create(letters)
        cancel_dependents([job.pk for job in jobs], now=now, using=using)
    return letters


_SUCCESS_SLOTS = {
    "pk": Job._meta.pk,
    "worker_id": Job._meta.get_field("worker_id"),
    "attempts": Job._meta.get_field("attempts"),
    "result": Job._meta.get_field("result"),
    "now": Job._meta.get_field("finished_at"),
}


def succeed(
    job: Job, *, worker_id: str, result: Any, now: datetime, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Record ``job``'s run as SUCCESSFUL with ``result``; return 1, or 0 if the run was late.

    Fenced like every outcome write (:meth:`.JobQuerySet.current_run`, §11);
    ``unique_lock`` and the lease are cleared (the window closed at the claim).
    Dependents are not touched: they may now run (§6). The ``UPDATE`` is
    compiled once per alias (:mod:`django_debounce.compiled`). ``job``'s
    fields are updated in place when the write hit. No signal is sent and the
    circuit breaker is not counted: the caller does both.

    Args:
        job: the RUNNING job, as claimed (its ``attempts`` is the fence).
        worker_id: the worker that runs it.
        result: the result's stored JSON form (already made storable).
        now: ``finished_at``, an aware datetime.
        using: database alias.
    """

    def build(slot: Mapping[str, Any]) -> Any:
        return compiled.update_query(
            Job.objects.using(using).current_run(
                slot["pk"], attempts=slot["attempts"], worker_id=slot["worker_id"]
            ),
            status=Status.SUCCESSFUL,
            result=slot["result"],
            finished_at=slot["now"],
            lease_expires_at=None,
            unique_lock=None,
        )

    # One entry for every result (tests/processes/claim/test_claim_cache_and_connection_attacks.py).
    entry = compiled.compiled(("record_success",), build, _SUCCESS_SLOTS, using)
    values = {
        "pk": job.pk,
        "worker_id": worker_id,
        "attempts": job.attempts,
        "result": result,
        "now": now,
    }
    updated = compiled.execute_update(entry, values, using)
    if updated:
        job.status, job.result, job.finished_at = Status.SUCCESSFUL, result, now
        job.lease_expires_at = job.unique_lock = None
    return updated
