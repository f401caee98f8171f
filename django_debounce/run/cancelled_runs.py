"""A run that stopped because its cancel was requested ends CANCELLED (contract §8, decision 186).

``Job.cancel()`` marks a RUNNING job (``cancel_requested_at``); the task sees
the mark through its context and stops (it raises
:class:`~django_debounce.exceptions.JobCancelled`, or an async task is
cancelled). :func:`record_cancelled` writes that end: CANCELLED, no retry,
no dead letter (a planned outcome, as for a READY job cancelled, §8), the
lease, window and lock cleared, the READY dependents cancelled in the same
transaction (§6), fenced on the run like every outcome write (§11).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from .. import lifecycle
from ..conf import settings
from ..db_errors import retry_transient
from ..log_fields import job_fields
from ..models import Job
from ..signals import job_finished, send_signal
from .final_failures import log_discarded_late_run

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status


def record_cancelled(
    job: Job,
    *,
    worker_id: str,
    using: str,
    error: str = "",
    tb: str = "",
    retry_for: timedelta | None = None,
) -> bool:
    """End ``job``'s run CANCELLED: its cancel was requested and the run stopped (decision 186).

    Sends ``job_finished`` with ``status="CANCELLED"`` for a recorded end; a
    late run (its job reclaimed meanwhile) is logged and discarded.

    Args:
        job: the job as claimed (its ``attempts`` is the run's fence); updated in place.
        worker_id: the id it was claimed under.
        using: database alias.
        error: what the run raised as it stopped (``"dotted.Class: message"``), kept on the row.
        tb: its traceback text.
        retry_for: how long the write retries through transient errors (default ``DEBOUNCE_LEASE``).

    Returns:
        True if the job ended CANCELLED; False for a late run (nothing written).

    Raises:
        OperationalError, InterfaceError: the database stayed unreachable for
            ``retry_for``: the job stays RUNNING until its lease lapses.
    """

    def write() -> bool:
        with transaction.atomic(using=using):
            now = timezone.now()
            updated = (
                Job.objects.using(using)
                .current_run(job.pk, attempts=job.attempts, worker_id=worker_id)
                .update(
                    status=Status.CANCELLED,
                    finished_at=now,
                    window_key=None,
                    unique_lock=None,
                    lease_expires_at=None,
                    error=error,
                    traceback=tb,
                )
            )
            if updated:
                lifecycle.cancel_dependents([job.pk], now=now, using=using)
                job.status, job.finished_at, job.lease_expires_at = Status.CANCELLED, now, None
                job.window_key, job.unique_lock, job.error, job.traceback = None, None, error, tb
            return bool(updated)

    done = retry_transient(
        write, using=using, patience=settings.lease if retry_for is None else retry_for
    )
    if not done:
        log_discarded_late_run(job)
        return False
    logger.info(
        "job %s (%s) cancelled while it ran",
        job.pk,
        job.task_name,
        extra=job_fields(job, action="job_cancelled", outcome="cancelled", now=job.finished_at),
    )
    send_signal(job_finished, job=job, status=job.status)
    return True


__all__ = ["record_cancelled"]
