"""Retrying dead letters in bulk (contract §8, §11), and when a worker sweeps (retry, prune).

:func:`retry_dead_letters` selects dead letters by filters and retries each
one with :func:`~django_debounce.ops.dead_letters.retry_dead_letter` (what
:meth:`DeadLetter.retry() <django_debounce.models.DeadLetter.retry>` runs),
the normal enqueue path: a call made now with the original task, arguments,
queue, priority and metadata, so a debounced task joins its key's open
window. ``retry()`` locks the entry's row and does nothing when the entry was
retried meanwhile, so two sweeps racing (two workers, a worker and an admin)
retry an entry once.

Entries whose reason carries a reserved prefix (``shed:``, ``codel:``,
``unknown_task:``) are skipped unless asked for: re-running what the
scheduler deliberately dropped would undo the shed, and an unknown task stays
unknown (§8). The automatic sweep never asks for them. They are told apart by
their ``kind`` column (``DeadLetter.Kind``, indexed), which the row
took from that prefix when it was written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from ..conf import AutoRetry, settings
from ..dead_letter_kinds import REASON_PREFIXES, RESERVED_KINDS, SHED_KINDS
from ..models import DeadLetter
from .dead_letters import retry_dead_letter
from .retention import PruneResult, prune_jobs

logger = logging.getLogger("django_debounce.sweep")


@dataclass
class SweepResult:
    """What one :func:`retry_dead_letters` call did (or, with ``dry_run``, would do).

    Attributes:
        retried: entries retried (with ``dry_run``: entries that would be).
        already_retried: entries matching the filters that were retried
            before (also by another caller racing this one: their
            ``retry()`` returned ``None``); never retried again.
        reserved: entries matching the other filters but skipped for a
            reserved reason prefix (already retried ones included).
        exhausted: entries skipped because their chain of retries reached
            ``max_depth`` (automatic sweep).
        failed: entries whose retry raised (e.g. the task's declaration
            changed so that the stored call is no longer valid); logged.
        job_ids: the jobs the retries went to, in order (empty with ``dry_run``).
    """

    retried: int = 0
    already_retried: int = 0
    reserved: int = 0
    exhausted: int = 0
    failed: int = 0
    job_ids: list[int] = field(default_factory=list)


def retry_dead_letters(
    *,
    tasks: Iterable[str] | None = None,
    reason_prefix: str | None = None,
    older_than: timedelta | None = None,
    include_shed: bool = False,
    max_depth: int | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
    progress: Callable[[], bool] | None = None,
) -> SweepResult:
    """Retry the dead letters that match the filters and were never retried (§8).

    Oldest entries first. Each retry is its own transaction (the entry's row
    lock plus the enqueue), so one entry that cannot be retried does not undo
    the others.

    Args:
        tasks: only entries of these task names (``None``: all).
        reason_prefix: only entries whose ``reason`` starts with this text. A
            prefix that itself starts with a reserved prefix (e.g.
            ``"unknown_task:"``) selects those reserved entries explicitly.
        older_than: only entries created at least this long ago
            (``created_at <= now - older_than``).
        include_shed: also retry ``shed:`` and ``codel:`` entries
            (``unknown_task:`` ones still need an explicit ``reason_prefix``).
        max_depth: only entries whose ``retry_depth`` is below this (the
            automatic sweep's ``max_retries``: at most that many retries along
            one job's chain); ``None``: no limit.
        limit: retry at most this many entries (``None``: all).
        dry_run: count what would be retried; write nothing.
        now: the time the filters compare with (default ``timezone.now()``).
        using: database alias.
        progress: called after each entry; returning ``False`` stops the
            retries there (the rest stay for the next call). The worker passes
            one that renews its running jobs' leases and stops on shutdown, so
            a sweep through a large backlog never lets a lease lapse.

    Returns:
        A :class:`SweepResult` with the counts.

    Raises:
        ValueError: ``limit`` or ``max_depth`` below 0 (nothing is written).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit} must be >= 0")
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth={max_depth} must be >= 0")
    now = now or timezone.now()
    qs = DeadLetter.objects.using(using).all()
    if tasks is not None:
        qs = qs.filter(task_name__in=list(tasks))
    if reason_prefix:
        qs = qs.filter(reason__startswith=reason_prefix)
    if older_than is not None:
        qs = qs.filter(created_at__lte=now - older_than)
    # A reason_prefix that starts with a reserved prefix asks for that kind explicitly.
    skipped = [
        kind
        for kind in RESERVED_KINDS
        if not (reason_prefix or "").startswith(REASON_PREFIXES[kind])
        and not (include_shed and kind in SHED_KINDS)
    ]
    result = SweepResult()
    if skipped:
        result.reserved = qs.filter(kind__in=skipped).count()
        qs = qs.exclude(kind__in=skipped)
    result.already_retried = qs.filter(retried_at__isnull=False).count()
    qs = qs.filter(retried_at__isnull=True)
    if max_depth is not None:
        result.exhausted = qs.filter(retry_depth__gte=max_depth).count()
        qs = qs.filter(retry_depth__lt=max_depth)
    ids = list(qs.order_by("created_at", "id").values_list("pk", flat=True)[:limit])
    if dry_run:
        result.retried = len(ids)
        return result
    for pk in ids:
        entry = DeadLetter(pk=pk)
        entry._state.db = using
        try:
            job = retry_dead_letter(entry)
        except Exception:
            result.failed += 1
            logger.exception("retrying dead letter %s failed", pk, extra={"action": "sweep_error"})
        else:
            if job is None:
                result.already_retried += 1
            else:
                result.retried += 1
                result.job_ids.append(job.pk)
        if progress is not None and not progress():
            break
    return result


def auto_retry(
    config: AutoRetry,
    *,
    using: str = DEFAULT_DB_ALIAS,
    progress: Callable[[], bool] | None = None,
) -> SweepResult:
    """Run the automatic sweep of ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` once (§8, §11).

    Retries every never-retried entry at least ``config.min_age`` old whose
    chain has had fewer than ``config.max_retries`` retries, skipping every
    reserved prefix. The worker calls it at the start of every ``--burst`` and
    at most once per ``config.every`` on its loop. ``progress``: as in
    :func:`retry_dead_letters`.
    """
    result = retry_dead_letters(
        older_than=config.min_age, max_depth=config.max_retries, using=using, progress=progress
    )
    # One line per sweep (at most once per ``every``), so an operator can see it ran.
    logger.info(
        "dead-letter sweep: retried %d, failed %d, skipped %d already retried, "
        "%d reserved, %d at max_retries",
        result.retried,
        result.failed,
        result.already_retried,
        result.reserved,
        result.exhausted,
        extra={"action": "sweep"},
    )
    return result


class SweepSchedule:
    """When a worker runs its sweeps: dead-letter auto-retry (§8, §11) and prune (issue #11).

    Each is due at the worker's start (so at the start of every ``--burst``)
    and then at most once per its setting's ``every``
    (``DEBOUNCE_DEAD_LETTER_AUTO_RETRY``, ``DEBOUNCE_PRUNE``), timed on the
    package's clock (§4.7). Each is off while its setting is ``None``. One
    schedule per worker.
    """

    def __init__(self) -> None:
        self.next_at: datetime | None = None
        """When the dead-letter sweep is next due; ``None``: now (it has not run yet)."""
        self.next_prune_at: datetime | None = None
        """When the prune is next due; ``None``: now (it has not run yet)."""
        self.last_prune: PruneResult | None = None
        """What the last automatic prune deleted (``None`` before the first)."""

    def run_if_due(
        self,
        *,
        using: str,
        lease: timedelta,
        stopping: threading.Event,
        renew: Callable[[], None],
    ) -> SweepResult | None:
        """Run the prune and :func:`auto_retry` when due; return the latter's result, or ``None``.

        Both run on the worker's loop thread, which also renews the leases of
        the jobs it runs: between entries (or batches), once a third of
        ``lease`` (a duration) has passed, ``renew()`` is called (it renews
        them, or does nothing when none runs), and the sweep stops once
        ``stopping`` is set, so a sweep through a large backlog never lets a
        lease lapse (a lapsed lease is a rerun, §7).
        """
        self._prune_if_due(using=using, progress=_lease_keeping(lease, stopping, renew))
        config = settings.dead_letter_auto_retry
        if config is None:
            return None
        now = timezone.now()
        if self.next_at is not None and now < self.next_at:
            return None
        result = auto_retry(config, using=using, progress=_lease_keeping(lease, stopping, renew))
        self.next_at = now + config.every
        return result

    def _prune_if_due(self, *, using: str, progress: Callable[[], bool]) -> None:
        """Run :func:`~django_debounce.ops.retention.prune_jobs` per ``DEBOUNCE_PRUNE`` when due."""
        config = settings.prune
        if config is None:
            return
        now = timezone.now()
        if self.next_prune_at is not None and now < self.next_prune_at:
            return
        self.last_prune = result = prune_jobs(
            older_than=config.older_than,
            batch_size=config.batch_size,
            dead_letters=config.dead_letters,
            now=now,
            using=using,
            progress=lambda deleted: progress(),
        )
        self.next_prune_at = now + config.every
        logger.info(
            "prune: deleted %d finished job(s) and %d dead letter(s) in %d batch(es); "
            "kept %d a waiting job depends on",
            result.jobs,
            result.dead_letters,
            result.batches,
            result.kept_dependencies,
            extra={"action": "prune"},
        )


def _lease_keeping(
    lease: timedelta, stopping: threading.Event, renew: Callable[[], None]
) -> Callable[[], bool]:
    """Return a ``progress()`` that renews leases every ``lease / 3`` and is False once stopping."""
    renew_at = timezone.now() + lease / 3

    def progress() -> bool:
        nonlocal renew_at
        if stopping.is_set():
            return False
        if timezone.now() >= renew_at:
            renew()
            renew_at = timezone.now() + lease / 3
        return True

    return progress
