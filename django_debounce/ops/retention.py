"""Deleting finished jobs (and, if asked, old dead letters) in small batches (issue #11, item 3).

:func:`prune_jobs` is what ``manage.py prune_debounce_jobs`` and the worker's
automatic prune (``DEBOUNCE_PRUNE``, :class:`~django_debounce.ops.sweep.SweepSchedule`)
run. A job is pruned when it is finished (SUCCESSFUL, FAILED, CANCELLED,
EXPIRED or SHED) with ``finished_at`` before the cutoff, no READY or
RUNNING job depends on it (§6: deleting a dependency would delete the
dependency link with it and let the waiting job run early), and its debounce
ceiling (``max_run_at``) has passed: a leading or both burst is read from its
key's rows whose ceiling is still ahead, so its finished leading job is what
keeps the burst swallowing calls until it closes (decision 181).

Each batch is one short transaction: pick at most ``batch_size`` ids through
the ``finished_at`` index, then ``Job.objects.filter(pk__in=ids).delete()``.
Django's deletion collector applies every ``on_delete`` of the models pointing
at ``Job`` (the package's and the project's): dependency links are deleted,
``DeadLetter.job`` and ``DeadLetter.retry_job`` become NULL, so a dead letter
outlives its job and its Retry still works (the entry stores the task, args
and kwargs; decision 110). Every statement names at most one batch of ids, and
row locks last one batch, never the whole prune.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from ..models import DeadLetter, Job, JobDependency

#: Rows deleted per transaction unless told otherwise.
DEFAULT_BATCH_SIZE = 1000

#: The final statuses a job is pruned in (READY and RUNNING jobs are never pruned).
FINISHED = (
    Job.Status.SUCCESSFUL,
    Job.Status.FAILED,
    Job.Status.CANCELLED,
    Job.Status.EXPIRED,
    Job.Status.SHED,
)


@dataclass
class PruneResult:
    """What one :func:`prune_jobs` call deleted (with ``dry_run``: would delete).

    Attributes:
        jobs: jobs deleted.
        kept_dependencies: finished jobs before the cutoff kept because a
            READY or RUNNING job depends on them.
        dead_letters: dead letters deleted (only with ``dead_letters=True``).
        batches: transactions committed (0 with ``dry_run``).
        stopped: ``progress`` returned False before the end; the rest stays
            for the next prune.
    """

    jobs: int = 0
    kept_dependencies: int = 0
    dead_letters: int = 0
    batches: int = 0
    stopped: bool = False


def prunable_jobs(
    cutoff: datetime, *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> QuerySet[Job]:
    """Return the finished jobs :func:`prune_jobs` deletes: before ``cutoff``, no waiter.

    A job whose debounce ceiling (``max_run_at``) is after ``now`` is kept:
    its key's burst may still be open (decision 181). It goes at the first
    prune after its ceiling, at most ``debounce_max_wait`` after its window opened.

    Args:
        cutoff: an aware datetime; jobs with ``finished_at < cutoff`` qualify.
        now: the instant ceilings are compared with (default ``timezone.now()``).
        using: database alias.
    """
    now = now or timezone.now()
    return (
        _finished_before(cutoff, using)
        .filter(Q(max_run_at__isnull=True) | Q(max_run_at__lte=now))
        .exclude(Exists(_waiting_dependents(using)))
    )


def _finished_before(cutoff: datetime, using: str) -> QuerySet[Job]:
    return Job.objects.using(using).filter(finished_at__lt=cutoff, status__in=FINISHED)


def _waiting_dependents(using: str) -> QuerySet[JobDependency]:
    """Links from a READY or RUNNING job to the outer job (its dependency)."""
    return JobDependency.objects.using(using).filter(
        dependency=OuterRef("pk"), job__status__in=[Job.Status.READY, Job.Status.RUNNING]
    )


def prune_jobs(
    *,
    older_than: timedelta,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dead_letters: bool = False,
    dry_run: bool = False,
    now: datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
    progress: Callable[[int], bool] | None = None,
    result: PruneResult | None = None,
) -> PruneResult:
    """Delete finished jobs older than ``older_than``, one batch per transaction (issue #11).

    Args:
        older_than: a positive duration; the cutoff is ``now - older_than``
            and compares with ``finished_at`` (jobs) or ``created_at`` (dead letters).
        batch_size: ids per transaction (and at most that many per statement), >= 1.
        dead_letters: also delete dead letters created before the cutoff
            (kept by default: they are the record of what failed or was shed).
        dry_run: count, write nothing.
        now: the instant the cutoff counts back from (default ``timezone.now()``).
        using: database alias.
        progress: called after each batch with the rows that batch deleted;
            returning False stops the prune there (the worker passes one that
            renews its leases and stops on shutdown).
        result: a :class:`PruneResult` to count into, batch by batch (default
            a new one). When the prune is interrupted (``KeyboardInterrupt``:
            the batch in flight rolls back) it holds what was committed
            (``prune_debounce_jobs`` reports it; decision 134).

    Returns:
        A :class:`PruneResult` with the counts (``result`` when given).

    Raises:
        ValueError: ``batch_size`` below 1 or ``older_than`` not positive
            (nothing is deleted).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    if older_than <= timedelta(0):
        raise ValueError(f"older_than={older_than} must be longer than zero")
    now = now or timezone.now()
    cutoff = now - older_than
    result = result if result is not None else PruneResult()
    candidates = prunable_jobs(cutoff, now=now, using=using)
    if dry_run:
        result.jobs = candidates.count()
        result.kept_dependencies = _kept_dependencies(cutoff, using)
        if dead_letters:
            result.dead_letters = _old_letters(cutoff, using).count()
        return result

    def jobs(count: int) -> None:
        result.jobs, result.batches = result.jobs + count, result.batches + 1

    def letters(count: int) -> None:
        result.dead_letters, result.batches = result.dead_letters + count, result.batches + 1

    result.stopped = _delete_all(candidates, batch_size, progress, jobs)
    if dead_letters and not result.stopped:
        result.stopped = _delete_all(_old_letters(cutoff, using), batch_size, progress, letters)
    result.kept_dependencies = _kept_dependencies(cutoff, using)
    return result


def _kept_dependencies(cutoff: datetime, using: str) -> int:
    return _finished_before(cutoff, using).filter(Exists(_waiting_dependents(using))).count()


def _old_letters(cutoff: datetime, using: str) -> QuerySet[DeadLetter]:
    return DeadLetter.objects.using(using).filter(created_at__lt=cutoff)


def _delete_all(
    rows: QuerySet[Job] | QuerySet[DeadLetter],
    batch_size: int,
    progress: Callable[[int], bool] | None,
    tally: Callable[[int], None],
) -> bool:
    """Delete ``rows`` batch by batch, ``tally`` each committed batch; True: stopped by ``progress``."""
    while True:
        count = _delete_batch(rows, batch_size)
        if not count:
            return False
        tally(count)
        if progress is not None and not progress(count):
            return True


def _delete_batch(rows: QuerySet[Job] | QuerySet[DeadLetter], batch_size: int) -> int:
    """Delete up to ``batch_size`` of ``rows`` in one transaction; return how many went.

    The ids are chosen and locked (``FOR UPDATE SKIP LOCKED`` where the
    database has it: a row another transaction holds waits for the next
    prune) inside the transaction that deletes them, so the "no waiting
    dependent" test and the delete see the same rows.
    """
    using = rows.db
    features = connections[using].features
    with transaction.atomic(using=using):
        picked = rows.order_by()
        if features.has_select_for_update_skip_locked and features.has_select_for_update_of:
            picked = picked.select_for_update(skip_locked=True, of=("self",))
        ids = list(picked.values_list("pk", flat=True)[:batch_size])
        if ids:
            # Only the ids are read back: the collector needs no other column.
            rows.model._default_manager.using(using).filter(pk__in=ids).only("pk").delete()
    return len(ids)
