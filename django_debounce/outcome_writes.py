"""The status writes of a claimed job, one function per kind (contract §6, §7, §8, §11).

:mod:`django_debounce.outcomes` and :mod:`django_debounce.leases` decide
which write a job gets; the ``UPDATE`` statements and the dead-letter row are
built only here: SUCCESSFUL (:func:`set_succeeded`), READY for a retry
(:func:`set_retry`), FAILED (:func:`set_failed`, with :func:`dead_letter_for`)
and EXPIRED (:func:`set_expired`); :func:`fail_with_dead_letter` is a run's
FAILED write with its dead letter. A write about a run goes through
:func:`this_run`, the fence of §11: once the run's lease lapsed and another
worker reclaimed the job, it touches nothing and returns 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.db.models.sql.query import Query
from django.utils import timezone

from . import admission, compiled, registry
from .dependencies import cancel_dependents
from .models import DeadLetter, Job
from .signals import job_dead_lettered, job_finished, send_signal

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status


def counted_in_breaker(
    job: Job, write: Callable[[], int], *, succeeded: bool, now: datetime, using: str
) -> int:
    """Run the fenced outcome ``write`` and return its row count.

    For a task with a circuit breaker the run is counted in the breaker
    (:func:`admission.record_run`, §6) in the same transaction, only if the
    write hit (a late run whose job was reclaimed counts for nothing).
    """
    task = registry.lookup(job.task_name)
    if task is None or task.options.circuit_breaker is None:
        return write()
    with transaction.atomic(using=using):
        updated = write()
        if updated:
            admission.record_run(job, succeeded=succeeded, now=now, using=using)
        return updated


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
    """Fail ``job``'s run for good and write its dead letter, in one transaction (§8).

    The FAILED write of this run (:func:`this_run`, :func:`set_failed`), its
    dead letter (:func:`dead_letter_for`), its dependents cancelled and the
    failure counted in the task's circuit breaker; then ``job`` is updated in
    place, the line logged and ``job_finished`` and ``job_dead_lettered`` sent.

    Returns the dead letter, or ``None`` when the run was late (nothing written).
    """
    with transaction.atomic(using=using):
        now = timezone.now()
        updated = set_failed(
            this_run(job, worker_id=worker_id, using=using), now=now, error=error, tb=tb
        )
        if not updated:
            return None
        letter = dead_letter_for(
            job, reason=reason, error=error, tb=tb, metadata=metadata, using=using
        )
        letter.save(using=using)
        cancel_dependents([job.pk], now=now, using=using)
        # A failed run counts in the task's circuit breaker (§6); unknown tasks have none.
        admission.record_run(job, succeeded=False, now=now, using=using)
    job.status, job.finished_at, job.error, job.traceback = Status.FAILED, now, error, tb
    job.lease_expires_at = job.unique_lock = None
    logger.warning(
        "job %s (%s) failed for good; dead letter %s: %s",
        job.pk,
        job.task_name,
        letter.pk,
        reason[:200],
        extra={"action": "dead_letter", "job_id": job.pk},
    )
    send_signal(job_finished, job=job, status=job.status)
    send_signal(job_dead_lettered, job=job, dead_letter=letter)
    return letter


def this_run(job: Job, *, worker_id: str, using: str) -> QuerySet[Job]:
    """``job``'s row while it is still this run's: RUNNING for ``worker_id`` on this attempt (§11)."""
    return Job.objects.using(using).filter(
        pk=job.pk, status=Status.RUNNING, worker_id=worker_id, attempts=job.attempts
    )


_SUCCESS_SLOTS = {
    "pk": Job._meta.pk,
    "worker_id": Job._meta.get_field("worker_id"),
    "attempts": Job._meta.get_field("attempts"),
    "result": Job._meta.get_field("result"),
    "now": Job._meta.get_field("finished_at"),
}


def set_succeeded(job: Job, *, worker_id: str, result: Any, now: datetime, using: str) -> int:
    """The SUCCESSFUL write of this run (:func:`this_run`) with ``result`` (its stored JSON).

    Returns 1, or 0 if the run was late. The ``UPDATE`` is compiled once per
    alias (:mod:`django_debounce.compiled`): it is every job's last write.
    """

    def build(slot: Mapping[str, Any]) -> Query:
        return compiled.update_query(
            Job.objects.using(using).filter(
                pk=slot["pk"],
                status=Status.RUNNING,
                worker_id=slot["worker_id"],
                attempts=slot["attempts"],
            ),
            status=Status.SUCCESSFUL,
            result=slot["result"],
            finished_at=slot["now"],
            lease_expires_at=None,
            unique_lock=None,
        )

    entry = compiled.compiled(("record_success",), build, _SUCCESS_SLOTS, using)
    values = {
        "pk": job.pk,
        "worker_id": worker_id,
        "attempts": job.attempts,
        "result": result,
        "now": now,
    }
    return compiled.execute_update(entry, values, using)


def set_retry(
    job: Job, *, worker_id: str, run_at: datetime, error: str, tb: str, using: str
) -> int:
    """The retry write of this run: READY again at ``run_at``, with the run's error; 0 if late."""
    return this_run(job, worker_id=worker_id, using=using).update(
        status=Status.READY,
        run_at=run_at,
        worker_id="",
        lease_expires_at=None,
        error=error,
        traceback=tb,
    )


def set_failed(jobs: QuerySet[Job], *, now: datetime, error: str, tb: str | None) -> int:
    """The FAILED write of ``jobs`` (failed for good); ``tb`` ``None`` keeps the stored traceback.

    The caller writes the dead letters and cancels the dependents in the same transaction.
    """
    if tb is None:
        return jobs.update(
            status=Status.FAILED,
            finished_at=now,
            lease_expires_at=None,
            unique_lock=None,
            error=error,
        )
    return jobs.update(
        status=Status.FAILED,
        finished_at=now,
        lease_expires_at=None,
        unique_lock=None,
        error=error,
        traceback=tb,
    )


def set_expired(ids: list[int], *, now: datetime, using: str) -> None:
    """The EXPIRED write of the jobs ``ids``, their dependents cancelled with it."""
    Job.objects.using(using).filter(pk__in=ids).update(
        status=Status.EXPIRED, finished_at=now, window_key=None, unique_lock=None
    )
    cancel_dependents(ids, now=now, using=using)


def dead_letter_for(
    job: Job, *, reason: str, error: str, tb: str, metadata: dict[str, Any], using: str
) -> DeadLetter:
    """Return the (unsaved) dead letter of ``job`` failing for good (§8), made now.

    ``reason`` starts with one of the reserved prefixes (``failed:``,
    ``unknown_task:``); ``metadata`` holds at least ``{"attempts": N}``.
    """
    return DeadLetter(
        job=job,
        task_name=job.task_name,
        queue=job.queue,
        args=job.args,
        kwargs=job.kwargs,
        reason=reason,
        metadata=metadata,
        error=error,
        traceback=tb,
        created_at=timezone.now(),
        retry_depth=DeadLetter.retry_depth_for(job, using=using),
    )


__all__ = [
    "counted_in_breaker",
    "dead_letter_for",
    "fail_with_dead_letter",
    "set_expired",
    "set_failed",
    "set_retry",
    "set_succeeded",
    "this_run",
]
