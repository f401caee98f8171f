"""A run's final failure: the job ends FAILED with a dead letter (contract §6, §8, §9, §11).

:mod:`django_debounce.run.outcomes` ends a run here when it failed with no retry
left, when no task of its name is registered, or when the database refused
its outcome (:func:`bury_unstorable`: a run is never repeated because its
outcome could not be written). :func:`fail_with_dead_letter` is the write
(:func:`django_debounce.lifecycle.bury`) with what surrounds it: the circuit
breaker's count in the same transaction, the log line and the signals.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import lifecycle
from ..db_errors import retry_transient
from ..flow import breaker_runs
from ..log_fields import job_fields
from ..models import DeadLetter, Job
from ..signals import job_dead_lettered, job_finished, send_signal
from .storable import ascii_text, format_error, format_traceback

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")


def fail_with_dead_letter(
    job: Job,
    *,
    worker_id: str,
    using: str,
    reason: str,
    error: str,
    tb: str,
    metadata: dict[str, Any],
) -> DeadLetter | None:
    """Fail ``job``'s run for good with its dead letter (:func:`.lifecycle.bury`, §8).

    The failure is counted in the task's circuit breaker in the same
    transaction (§6); then the line is logged and ``job_finished`` and
    ``job_dead_lettered`` are sent. Returns the dead letter, or ``None`` when
    the run was late (nothing written).
    """
    with transaction.atomic(using=using):
        now = timezone.now()
        letter = lifecycle.bury(
            job,
            worker_id=worker_id,
            reason=reason,
            error=error,
            tb=tb,
            metadata=metadata,
            now=now,
            using=using,
        )
        if letter is None:
            return None
        breaker_runs.record_run(job, succeeded=False, now=now, using=using)
    logger.warning(
        "job %s (%s) failed for good; dead letter %s: %s",
        job.pk,
        job.task_name,
        letter.pk,
        reason[:200],
        extra=job_fields(job, action="dead_letter", outcome="dead_lettered", now=job.finished_at),
    )
    send_signal(job_finished, job=job, status=job.status)
    send_signal(job_dead_lettered, job=job, dead_letter=letter)
    return letter


def bury_unstorable(
    job: Job,
    what: str,
    refused: BaseException,
    *,
    worker_id: str,
    using: str,
    patience: timedelta,
    error: str = "",
) -> None:
    """Fail ``job`` for good because the database refused its outcome (``what``: ``"result"``, ``"error"``).

    The dead letter's reason names the refusal; the texts are written as
    ASCII (``backslashreplace``), which every database stores. Metadata:
    ``{"attempts": N, "unstorable": what}``. If even this write is refused,
    the error is logged and the job is left to its lease.
    """
    cause = format_error(refused)
    run = "succeeded but its result" if what == "result" else "failed and its error"
    reason = ascii_text(
        f"failed: {job.attempts} attempt(s); the run {run} could not be stored: {cause}"
    )
    try:
        letter = retry_transient(
            lambda: fail_with_dead_letter(
                job,
                worker_id=worker_id,
                using=using,
                reason=reason[:2000],
                error=ascii_text(error or cause),
                tb=ascii_text(format_traceback(refused)),
                metadata={"attempts": job.attempts, "unstorable": what},
            ),
            using=using,
            patience=patience,
        )
    except Exception:
        logger.exception(
            "job %s (%s): the database refused its dead letter too; the job is left to its lease",
            job.pk,
            job.task_name,
            extra={"action": "outcome_refused", "job_id": job.pk},
        )
        return
    if letter is None:
        log_discarded_late_run(job)


def log_discarded_late_run(job: Job) -> None:
    """Log that ``job``'s run no longer holds the job, so its outcome is discarded (§11).

    The fenced write found another run's mark: the lease lapsed and the job was
    reclaimed, or the run was already recorded ended (its hard time limit, decision 187;
    a cancel, decision 186). The line names no one cause: the write cannot tell them apart.
    """
    logger.warning(
        "job %s (%s): this run no longer holds the job (its lease lapsed and the job was "
        "reclaimed, or the run was already recorded ended: a hard time limit, a cancel); "
        "this run's outcome is discarded",
        job.pk,
        job.task_name,
        extra={"action": "late_result", "job_id": job.pk},
    )


def log_refused(job: Job, what: str, exc: BaseException) -> None:
    """Log that the database refused ``what`` (the result, the error) of ``job``'s run."""
    logger.error(
        "job %s (%s): the database refused the %s of attempt %d (%s)",
        job.pk,
        job.task_name,
        what,
        job.attempts,
        format_error(exc),
        extra={"action": "outcome_refused", "job_id": job.pk},
    )


__all__ = ["bury_unstorable", "fail_with_dead_letter", "log_discarded_late_run", "log_refused"]
