"""A claimed job whose task this process does not know: put back during a deploy, else dead-lettered.

Contract §7: only registered task names run, and a row naming a task the
worker does not know is dead-lettered (``unknown_task:``); the worker never
imports a dotted path taken from the database. During a rolling deploy,
though, a worker started before the code that declares a task (for the other
executor, or at all) claims that task's first jobs within seconds of their
enqueue. So (decision 154) a job is dead-lettered only once
``DEBOUNCE_UNKNOWN_TASK_GRACE`` (10 minutes) has passed since its last
enqueue (``last_enqueued_at``); before that it is put back READY, its attempt
not counted, to be claimed again :data:`RECHECK` later, by a process that
knows the task (the other executor's claim, a restarted worker) or by this
one, which looks again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import F
from django.utils import timezone

from ..conf import settings
from ..db_errors import retry_transient
from ..exceptions import UnknownTaskError
from ..log_fields import job_fields
from ..models import Job
from . import outcomes
from .final_failures import log_discarded_late_run
from .storable import format_error

logger = logging.getLogger("django_debounce.worker")

#: How long a put-back job waits before it is offered again (at most the grace left).
RECHECK = timedelta(seconds=5)


def grace_ends(job: Job) -> datetime:
    """Return when ``job``'s grace ends: its last enqueue (else its creation) plus the grace."""
    since = job.last_enqueued_at or job.created_at or timezone.now()
    return since + settings.unknown_task_grace


def handle_unknown_task(
    job: Job, *, worker_id: str, using: str, retry_for: timedelta | None = None
) -> None:
    """Put ``job`` back while its grace lasts, else dead-letter it as ``unknown_task:`` (§7, §8).

    The put-back is fenced on the run (id, RUNNING, ``worker_id``, attempt,
    §11), undoes the claim's attempt, clears the lease and worker, and sets
    ``run_at`` :data:`RECHECK` ahead (or to the grace's end, if sooner) so the
    job is not claimed again at once; its ``error`` says why. The window the
    claim closed stays closed (§4.1). ``job`` is updated in place (READY).

    Raises:
        OperationalError, InterfaceError: the write failed for ``retry_for``
            (default ``DEBOUNCE_LEASE``): the job stays RUNNING until its lease lapses.
    """
    now = timezone.now()
    ends = grace_ends(job)
    if now >= ends:
        outcomes.bury_unknown_task(job, worker_id=worker_id, using=using, retry_for=retry_for)
        return
    run_at = min(now + RECHECK, ends)
    error = format_error(
        UnknownTaskError(
            f"no task named {job.task_name!r} is registered in this process; put back until "
            f"{ends:%Y-%m-%d %H:%M:%S} UTC for a process that knows it (see the dead letter "
            "it gets after that)"
        )
    )
    fields = {
        "status": Job.Status.READY,
        "worker_id": "",
        "lease_expires_at": None,
        "attempts": F("attempts") - 1,
        "run_at": run_at,
        "error": error,
    }
    if job.attempts <= 1:
        fields["started_at"] = None

    def put_back() -> int:
        return (
            Job.objects.using(using)
            .filter(
                pk=job.pk, status=Job.Status.RUNNING, worker_id=worker_id, attempts=job.attempts
            )
            .update(**fields)
        )

    patience = settings.lease if retry_for is None else retry_for
    if not retry_transient(put_back, using=using, patience=patience):
        log_discarded_late_run(job)
        return
    job.status, job.worker_id, job.lease_expires_at = Job.Status.READY, "", None
    job.attempts, job.run_at, job.error = job.attempts - 1, run_at, error
    if job.attempts == 0:
        job.started_at = None
    logger.warning(
        "job %s names task %r, which this process does not know; put back, not dead-lettered, "
        "until %s (DEBOUNCE_UNKNOWN_TASK_GRACE after its last enqueue): a process that knows "
        "it (the other executor, or a worker running newer code) takes it meanwhile",
        job.pk,
        job.task_name,
        f"{ends:%Y-%m-%d %H:%M:%S} UTC",
        extra=job_fields(job, action="unknown_task_put_back", outcome="requeued"),
    )


__all__ = ["RECHECK", "grace_ends", "handle_unknown_task"]
