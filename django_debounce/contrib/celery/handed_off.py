"""The Celery side of the Celery executor: take a handed-off job by id and run it (issue #10).

What the Celery task ``django_debounce.run_job``
(:mod:`django_debounce.contrib.celery.tasks`) runs in a Celery worker, and what a
test runs in its place (:func:`run_handed_off`): :func:`take_and_run` takes the job
in one conditional statement (:func:`~django_debounce.contrib.celery.handoff.take`),
runs it through :func:`django_debounce.run.execution.run_job` (the built-in
worker's run: signals, result, retries with the task's backoff, dead letters)
while the process's one keeper thread renews its lease if it runs long
(:data:`~django_debounce.run.lease_keeper.process_keeper`, decision 183). The
scheduler's half is :mod:`django_debounce.contrib.celery.executor`, which
re-exports these names (their documented path).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import UTC, timedelta

from django.db import DEFAULT_DB_ALIAS, router
from django.utils import timezone

from ... import tracing
from ...conf import settings
from ...exceptions import JobFailedError, JobRetryError
from ...flow.start_rules import expired_at_start
from ...models import Job
from ...run import outcomes
from ...run.execution import run_job
from ...run.lease_keeper import process_keeper
from ...run.success_batches import SuccessBatch
from . import handoff

logger = logging.getLogger("django_debounce.celery")


def take_and_run(
    job_id: int, *, using: str | None = None, successes: SuccessBatch | None = None
) -> handoff.Taken:
    """Take the handed-off job ``job_id`` and run it in this (Celery worker) process.

    Takes the job (:func:`~django_debounce.contrib.celery.handoff.take`: one conditional
    statement); a message that finds nothing to take (a duplicate or late
    message, a job cancelled, expired, already run or handed off again) is
    logged at INFO (action ``noop``). Otherwise runs it through
    :func:`~django_debounce.run.execution.run_job` under a lease of
    ``DEBOUNCE_LEASE`` that a keeper thread renews every third of it, so a
    Celery worker that dies mid-job stops renewing and the job runs again
    after its lease (at least once, §7).

    ``successes``: where a plain success waits for its batched write (the Celery
    task passes its process's batch,
    :data:`~django_debounce.contrib.celery.batched_successes.process_successes`,
    decision 215; the job is then still RUNNING when this returns); ``None``
    writes it before this returns.

    Returns:
        :class:`~django_debounce.contrib.celery.handoff.Taken`: ``job`` is ``None`` for a
        no-op (``why`` says why); otherwise the job with this attempt's
        outcome: SUCCESSFUL, FAILED (dead letter written), READY (a retry is
        scheduled, or its task is not known here yet), EXPIRED (it reached this
        worker past its ``expires_at`` and never ran, decision 146), or still
        RUNNING when the run was late and its outcome discarded (§11).

    Raises:
        OperationalError, InterfaceError: the outcome could not be written
            (the job stays RUNNING until its lease lapses).
    """
    using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    worker_id = f"{_run_prefix()}{uuid.uuid4().hex[:8]}"
    lease: timedelta = settings.lease
    taken = handoff.take(job_id, worker_id=worker_id, lease=lease, using=using)
    job = taken.job
    if job is None:
        logger.info(
            "message for job %s is a no-op: %s",
            job_id,
            taken.why,
            extra={"action": "noop", "job_id": job_id},
        )
        return taken
    now = timezone.now()
    if expired_at_start(job, now):  # it waited in the broker past its expiry (decision 146)
        if outcomes.expire_claimed(
            job, started_before=None, worker_id=worker_id, now=now, using=using
        ):
            tracing.expired_unrun(job)
        return taken

    with process_keeper.holding(job.pk, worker_id=worker_id, lease=lease, using=using):
        run_job(job, worker_id=worker_id, using=using, retry_for=lease, successes=successes)
    return taken


_prefix: tuple[int, str] = (0, "")


def _run_prefix() -> str:
    """Return ``celery:host:pid:``, the start of this process's run worker ids (read once per pid)."""
    global _prefix
    if _prefix[0] != os.getpid():
        _prefix = (os.getpid(), f"celery:{socket.gethostname()}:{os.getpid()}:")
    return _prefix[1]


def _last_error_line(job: Job) -> str:
    lines = (job.error or "").strip().splitlines()
    return lines[-1] if lines else "no error recorded"


def failed_error(job: Job) -> JobFailedError:
    """Return the :class:`~django_debounce.exceptions.JobFailedError` of ``job``, which this attempt ended FAILED (decision 138)."""
    return JobFailedError(
        f"job {job.pk} ({job.task_name}) failed for good on attempt {job.attempts}: "
        f"{_last_error_line(job)}; its dead letter is written (`manage.py retry_dead_letters` "
        "runs it again)"
    )


def retry_error(job: Job) -> JobRetryError:
    """Return the :class:`~django_debounce.exceptions.JobRetryError` of ``job``, READY again after this attempt (decision 152)."""
    when = job.run_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return JobRetryError(
        f"job {job.pk} ({job.task_name}) is READY again and runs at {when} under this task id: "
        f"{_last_error_line(job)}"
    )


def run_handed_off(job_id: int, *, using: str | None = None) -> object:
    """Run the handed-off job ``job_id`` in this process (:func:`take_and_run`); return its stored result.

    What a test runs in place of a Celery worker (docs/howto/celery.md,
    "Testing"). Returns the job's stored result, or ``None`` when the message
    was a no-op or this attempt left the job READY (a retry is scheduled).
    The Celery task ``django_debounce.run_job`` maps the same outcomes onto
    Celery's states (:mod:`django_debounce.contrib.celery.tasks`).

    Raises:
        JobFailedError: this attempt ended the job FAILED (retries exhausted,
            or its task is unknown here: ``unknown_task:``); raised after the
            dead letter is written (decision 138).
    """
    job = take_and_run(job_id, using=using).job
    if job is None:
        return None
    if job.status == Job.Status.FAILED:
        # Raised only now: the job's outcome (its dead letter) is already written (decision 138).
        raise failed_error(job)
    return job.result if job.status == Job.Status.SUCCESSFUL else None


__all__ = ["failed_error", "retry_error", "run_handed_off", "take_and_run"]
