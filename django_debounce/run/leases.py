"""A claim's lease: renew it, reclaim it once lapsed, give back jobs never started (contract §7, §11).

A claimed job is RUNNING under a lease (``lease_expires_at``) that its worker
renews while the job runs (:func:`renew_leases`). A lease that lapsed means
the worker died or stalled: :func:`reclaim_expired_leases` puts such a job
back (or fails it for good once its retries are used). A worker stopping
before a claimed job started puts it back as it was before the claim
(:func:`release_unstarted`). Plain functions of job ids, a worker id and a
database alias, for any executor.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import F
from django.dispatch import Signal
from django.utils import timezone

from ..lifecycle import bury_lapsed
from ..log_fields import job_fields
from ..models import DeadLetter, Job
from ..progress import write_held
from ..signals import job_dead_lettered, send_signal

#: The worker's documented logger (docs/reference/commands.md): lease lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status

#: ``Job.worker_id`` of a job claimed for a hand-off to another executor (Celery) and not
#: taken by it yet (:mod:`django_debounce.contrib.celery.handoff`, decision 87): such a job has not started.
HANDOFF_PREFIX = "handoff:"

#: The error written on a job failed for good because its worker stopped renewing its lease.
LEASE_EXPIRED_ERROR = "django_debounce.worker.loop.LeaseExpired: the worker running this job stopped renewing its lease"


def renew_leases(ids: Iterable[int], *, worker_id: str, lease: timedelta, using: str) -> int:
    """Extend to now + ``lease`` the leases of the jobs ``ids`` still RUNNING for ``worker_id``.

    One ``UPDATE``; a job that finished or was reclaimed meanwhile is left
    alone. Then writes the progress these runs hold back, if a second has passed
    since their last write (:func:`~django_debounce.progress.write_held`: one
    fenced ``UPDATE`` per such run). Returns how many leases were renewed.

    Raises:
        DatabaseError: the write failed (the leases run on; renew again soon).
    """
    ids = list(ids)
    renewed = (
        Job.objects.using(using)
        .filter(pk__in=ids, status=Status.RUNNING, worker_id=worker_id)
        .update(lease_expires_at=timezone.now() + lease)
    )
    write_held(ids, using=using)  # progress a silent task reported (decision 203)
    return renewed


def reclaim_expired_leases(
    *, using: str = DEFAULT_DB_ALIAS, limit: int = 500, exclude_ids: Iterable[int] = ()
) -> tuple[int, int]:
    """Put back RUNNING jobs whose lease lapsed (their worker died, §7).

    ``exclude_ids`` are the jobs the calling worker is running right now: it
    is alive and renewing them (its clock may have jumped past their leases,
    e.g. under time-machine in tests). Everything else with a lapsed lease is
    an orphan, including jobs of an earlier process that used the same
    ``--worker-id``.

    A job handed off to Celery and never taken (its ``worker_id`` starts with
    :data:`HANDOFF_PREFIX`: the publish failed, or the message was lost or
    waited too long) never started: it goes back to READY with its attempt
    not counted, and is never dead-lettered for it (decision 88).

    A job that still has retries left goes back to READY, keeping its
    ``run_at`` (its place in line); one whose ``attempts`` already used every
    retry is FAILED with a dead letter (a job that kills its workers, §11;
    :func:`~django_debounce.lifecycle.bury_lapsed`).
    At most ``limit`` jobs per call, the longest lapsed first.

    Returns:
        ``(requeued, dead_lettered)`` counts.
    """
    features = connections[using].features
    letters: list[DeadLetter] = []
    lapsed = Job.objects.using(using).filter(
        status=Status.RUNNING, lease_expires_at__lte=timezone.now()
    )
    exclude = list(exclude_ids)
    if not lapsed.exclude(pk__in=exclude).exists():  # the usual case: no lock taken
        return 0, 0
    with transaction.atomic(using=using):
        now = timezone.now()
        # A lease is live while lease_expires_at > now (as in claimable_jobs), so it has
        # lapsed at lease_expires_at itself: reclaim then, before a later job of the key runs.
        qs = Job.objects.using(using).filter(status=Status.RUNNING, lease_expires_at__lte=now)
        if exclude:
            qs = qs.exclude(pk__in=exclude)
        if features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        stale = list(qs.order_by("lease_expires_at")[:limit])
        if not stale:
            return 0, 0
        handoffs = [job.pk for job in stale if job.worker_id.startswith(HANDOFF_PREFIX)]
        ran = [job for job in stale if job.pk not in handoffs]
        requeue = [job.pk for job in ran if job.attempts <= job.max_retries]
        exhausted = [job for job in ran if job.attempts > job.max_retries]
        running = Job.objects.using(using).filter(status=Status.RUNNING)
        if handoffs:  # never started: the claim's attempt is not counted
            running.filter(pk__in=handoffs).update(
                status=Status.READY, worker_id="", lease_expires_at=None, attempts=F("attempts") - 1
            )
        if requeue:
            running.filter(pk__in=requeue).update(
                status=Status.READY, worker_id="", lease_expires_at=None
            )
        requeue += handoffs
        if exhausted:
            letters = bury_lapsed(exhausted, error=LEASE_EXPIRED_ERROR, now=now, using=using)
    for job in stale:
        if job.pk in handoffs:
            _log_handoff_not_taken(job)
            continue
        logger.warning(
            "job %s (%s) lost its lease on worker %s; %s",
            job.pk,
            job.task_name,
            job.worker_id,
            "requeued" if job.pk in requeue else "dead-lettered",
            extra=job_fields(
                job,
                action="reclaim",
                outcome="requeued" if job.pk in requeue else "dead_lettered",
            ),
        )
    for letter in letters:
        send_signal(job_dead_lettered, job=letter.job, dead_letter=letter)
    return len(requeue), len(letters)


#: Sent (``job=``) for each hand-off no executor worker took within its lease, as the
#: reclaim hands it off again. The executor that handed it off names where its
#: message went (the Celery executor: :mod:`django_debounce.contrib.celery.handoff_watch`);
#: this layer does not import an executor.
handoff_not_taken = Signal()


def _log_handoff_not_taken(job: Job) -> None:
    """Report a hand-off no executor worker took within its lease (not a dead worker: nothing ran)."""
    if handoff_not_taken.has_listeners():
        handoff_not_taken.send(sender=Job, job=job)
        return
    logger.warning(
        "job %s (%s) was handed off by %s and never taken within the hand-off lease; handed "
        "off again, its attempt not counted",
        job.pk,
        job.task_name,
        job.worker_id.removeprefix(HANDOFF_PREFIX),
        extra=job_fields(job, action="reclaim", outcome="requeued"),
    )


def release_unstarted(
    jobs: Sequence[Job],
    started_before: Mapping[int, datetime | None],
    *,
    worker_id: str,
    using: str,
) -> int:
    """Put claimed jobs that never started back as they were before the claim (§7 shutdown).

    Undoes what the claim wrote (:func:`~django_debounce.claim.queries.mark_running`):
    READY again, no lease, no worker, the attempt not counted, ``started_at``
    as it was before the claim (``started_before``, by id, as
    :attr:`~django_debounce.claim.queries.ClaimedBatch.started_before` gives
    it). The window the claim closed stays closed (§4.1: a job put back after
    a claim takes no calls). Each job's update is fenced on this worker and
    the claim's attempt, so a job whose lease lapsed and that another worker
    took meanwhile is left alone. A token or a breaker probe the claim took
    from the admission gate (§6) is not given back.

    Returns:
        How many jobs were put back.

    Raises:
        DatabaseError: the write failed; the jobs stay RUNNING until their
            lease lapses and then run again, as after a crash (§7).
    """
    groups: dict[tuple[int, datetime | None], list[int]] = {}
    for job in jobs:
        groups.setdefault((job.attempts, started_before.get(job.pk)), []).append(job.pk)
    released = 0
    with transaction.atomic(using=using):
        for (attempts, started_at), ids in groups.items():
            released += (
                Job.objects.using(using)
                .filter(pk__in=ids, status=Status.RUNNING, worker_id=worker_id, attempts=attempts)
                .update(
                    status=Status.READY,
                    worker_id="",
                    lease_expires_at=None,
                    started_at=started_at,
                    attempts=attempts - 1,
                )
            )
    logger.info(
        "stopping: put back %d claimed job(s) that had not started: %s",
        released,
        [job.pk for job in jobs],
        extra={"action": "release"},
    )
    return released


__all__ = [
    "HANDOFF_PREFIX",
    "LEASE_EXPIRED_ERROR",
    "reclaim_expired_leases",
    "release_unstarted",
    "renew_leases",
]
