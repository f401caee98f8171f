"""Outcome writes: how a claimed job's run ends (contract §6, §7, §8, §11).

Plain functions of a job, a worker id, a time and a database alias, so that
any executor can record what happened to a job it claimed
(:func:`django_debounce.claim.claiming.claim_jobs`), not only the built-in worker loop:

* :func:`record_success`: the task returned;
* :func:`record_failure`: the task raised: a retry with backoff, or a dead letter;
* :func:`bury_unknown_task`: no task of the job's name is registered here;
* :func:`expire_claimed`: a job claimed ahead reached a thread past its expiry.

Every write about a run is fenced on (id, RUNNING, worker id, attempt): once
the run's lease lapsed and another worker reclaimed the job, the write touches
nothing and the run's outcome is discarded (§11). A write that meets a
transient database error is retried for up to ``retry_for``
(:func:`~django_debounce.db_errors.retry_transient`); one the database refuses for good ends the job
FAILED with a dead letter naming the refusal, so a run is never repeated
because its outcome could not be written. The terminal writes themselves
(succeed, bury, expire) are :mod:`django_debounce.lifecycle`'s; the retry
write, which does not end the job, is here. Renewing leases, reclaiming
lapsed ones and putting unstarted jobs back is :mod:`django_debounce.run.leases`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import lifecycle, registry
from ..conf import settings
from ..db_errors import is_transient, retry_transient
from ..exceptions import UnknownTaskError
from ..flow import breaker_runs
from ..log_fields import job_fields
from ..models import Job
from ..signals import job_finished, send_signal
from .backoff import backoff_delay
from .final_failures import (
    bury_unstorable,
    fail_with_dead_letter,
    log_discarded_late_run,
    log_refused,
)
from .storable import format_error, format_traceback, short_repr, storable_result

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status


def record_success(
    job: Job,
    result: object,
    *,
    worker_id: str,
    using: str,
    retry_for: timedelta | None = None,
    now: datetime | None = None,
) -> None:
    """Record that ``job``'s run returned ``result``, exactly once (§7, §11).

    The result is stored in a safe form
    (:func:`~django_debounce.run.storable.storable_result`). If the database still
    refuses that write for a reason a retry cannot fix, the result's short
    ``repr`` is stored instead; if that is refused too, the job ends FAILED
    with a dead letter naming the refusal. A late run (its job reclaimed) is
    logged and discarded. Sends ``job_finished`` for a recorded success.

    Args:
        job: the job as claimed (its ``attempts`` is the run's fence); updated
            in place when the write lands.
        result: what the task returned, any value.
        worker_id: the id the job was claimed under.
        using: database alias.
        retry_for: how long to retry the write through transient database
            errors (default ``DEBOUNCE_LEASE``; the worker passes its lease).
        now: the time written as ``finished_at`` (default: the write's time).

    Raises:
        OperationalError, InterfaceError: the database stayed unreachable for
            ``retry_for``: the job stays RUNNING until its lease lapses.
    """
    patience = settings.lease if retry_for is None else retry_for
    stored = storable_result(result)
    try:
        _write_success(job, stored, worker_id=worker_id, using=using, patience=patience, now=now)
    except Exception as exc:
        if is_transient(exc):
            raise  # the database stayed unreachable for a whole lease: an outage
        log_refused(job, "result", exc)
        fallback = short_repr(result)
        if fallback == stored:
            bury_unstorable(job, "result", exc, worker_id=worker_id, using=using, patience=patience)
            return
        try:
            _write_success(
                job, fallback, worker_id=worker_id, using=using, patience=patience, now=now
            )
        except Exception as again:
            if is_transient(again):
                raise
            log_refused(job, "short repr of the result", again)
            bury_unstorable(
                job, "result", again, worker_id=worker_id, using=using, patience=patience
            )


def record_failure(
    job: Job,
    exc: BaseException,
    *,
    worker_id: str,
    using: str,
    min_backoff: timedelta | None = None,
    max_backoff: timedelta | None = None,
    retry_for: timedelta | None = None,
    now: datetime | None = None,
) -> None:
    """Record that ``job``'s run raised ``exc``: schedule its retry, or fail it for good (§7, §8).

    With retries left (``attempts <= max_retries``) the job goes back to READY
    at ``now`` plus the backoff (:func:`~django_debounce.run.backoff.backoff_delay`,
    jittered per ``DEBOUNCE_BACKOFF_JITTER``); otherwise it ends FAILED with a
    ``failed:`` dead letter and its dependents are cancelled. The error and
    traceback are made storable and cut
    (:func:`~django_debounce.run.storable.format_error`). If the database refuses
    the write for a reason a retry cannot fix, the job ends FAILED with a dead
    letter naming the refusal, so the run is never repeated for it. A run
    counts as a failure in the task's circuit breaker, if it has one.

    Args:
        job: the job as claimed; updated in place when the write lands.
        exc: what the task raised.
        worker_id: the id the job was claimed under.
        using: database alias.
        min_backoff, max_backoff: the task's backoff bounds (``None``: the
            ``DEBOUNCE_MIN_BACKOFF`` / ``DEBOUNCE_MAX_BACKOFF`` settings).
        retry_for: as for :func:`record_success`.
        now: the failure's time (default: now); the retry is due after it. A
            dead letter is stamped with its write's own time.

    Raises:
        OperationalError, InterfaceError: as for :func:`record_success`.
    """
    patience = settings.lease if retry_for is None else retry_for
    error = format_error(exc)
    tb = format_traceback(exc)
    try:
        _write_failure(
            job,
            error,
            tb,
            worker_id=worker_id,
            using=using,
            patience=patience,
            now=now or timezone.now(),
            backoff=(min_backoff, max_backoff),
        )
    except Exception as refused:
        if is_transient(refused):
            raise  # the database stayed unreachable for a whole lease: an outage
        log_refused(job, "error", refused)
        bury_unstorable(
            job, "error", refused, worker_id=worker_id, using=using, patience=patience, error=error
        )


def bury_unknown_task(
    job: Job, *, worker_id: str, using: str, retry_for: timedelta | None = None
) -> None:
    """Fail ``job`` for good because no task of its name is registered here (§8).

    The worker never imports a path taken from the database. The dead letter's
    reason is ``"unknown_task: <name>"`` (``retry_dead_letters --reason-prefix
    unknown_task:`` runs them again once the workers know the task). Arguments
    and errors as for :func:`record_success`.
    """
    exc = UnknownTaskError(
        f"no task named {job.task_name!r} is registered in this worker; the worker never "
        "imports a path taken from the database. Either the module that declares it is not "
        "imported by this worker (its app must be in INSTALLED_APPS and the task in the app's "
        "tasks.py, which is autodiscovered, or in a module that tasks.py imports), or the "
        "worker started before the code that declares it was deployed (restart it). Then run "
        "`manage.py retry_dead_letters --reason-prefix unknown_task:`"
    )
    logger.error(
        "%s (job %s)", exc, job.pk, extra=job_fields(job, action="unknown_task", outcome="raised")
    )
    retry_transient(
        lambda: fail_with_dead_letter(
            job,
            worker_id=worker_id,
            using=using,
            reason=f"unknown_task: {job.task_name}",
            error=format_error(exc),
            tb="",
            metadata={"attempts": job.attempts},
        ),
        using=using,
        patience=settings.lease if retry_for is None else retry_for,
    )


def expire_claimed(
    job: Job,
    *,
    started_before: datetime | None,
    worker_id: str,
    now: datetime,
    using: str,
) -> bool:
    """End the claimed ``job`` as EXPIRED at the moment it would start: it waited past its expiry.

    A job claimed ahead (the worker's prefetch) that reaches a thread after its
    ``expires_at`` never runs, as if it had never been claimed (§6;
    :func:`~django_debounce.flow.start_rules.expired_at_start`, decision 146): the
    claim's attempt is taken back and ``started_at`` restored
    (``started_before``, as :func:`~django_debounce.run.leases.release_unstarted`
    does), no dead letter is written (§8) and its dependents are cancelled in
    the same transaction (§11). The write is fenced on the claim (RUNNING,
    ``worker_id``, the claim's attempt).

    Args:
        job: the claimed job as the claim returned it.
        started_before: its ``started_at`` before the claim.
        worker_id: the id it was claimed under.
        now: the moment it would have started (``finished_at``), an aware datetime.
        using: database alias.

    Returns:
        True if the job ended EXPIRED; False if the claim no longer held it
        (its lease lapsed and another worker took it).

    Raises:
        DatabaseError: the write failed; the job stays RUNNING until its lease
            lapses, then is expired by the claim that reclaims it.
    """
    with transaction.atomic(using=using):
        updated = (
            Job.objects.using(using)
            .filter(pk=job.pk, status=Status.RUNNING, worker_id=worker_id, attempts=job.attempts)
            .update(
                status=Status.EXPIRED,
                finished_at=now,
                window_key=None,
                unique_lock=None,
                lease_expires_at=None,
                started_at=started_before,
                attempts=job.attempts - 1,
            )
        )
        if updated:
            lifecycle.cancel_dependents([job.pk], now=now, using=using)
    if updated:
        job.status, job.finished_at, job.attempts = Status.EXPIRED, now, job.attempts - 1
        logger.info(
            "expired job %s (%s): claimed ahead, it reached a thread after its expiry",
            job.pk,
            job.task_name,
            extra=job_fields(job, action="expire", outcome="expired"),
        )
    return bool(updated)


# -- the steps -------------------------------------------------------------------------------


def _write_success(
    job: Job, stored: Any, *, worker_id: str, using: str, patience: timedelta, now: datetime | None
) -> None:
    """Write SUCCESSFUL with ``stored`` (the result's JSON), log it and send ``job_finished``."""
    now = now or timezone.now()
    updated = retry_transient(
        lambda: _counted_in_breaker(
            job,
            lambda: lifecycle.succeed(
                job, worker_id=worker_id, result=stored, now=now, using=using
            ),
            succeeded=True,
            now=now,
            using=using,
        ),
        using=using,
        patience=patience,
    )
    if not updated:
        log_discarded_late_run(job)
        return
    logger.info(
        "job %s (%s) succeeded on attempt %d",
        job.pk,
        job.task_name,
        job.attempts,
        extra=job_fields(job, action="job_succeeded", outcome="succeeded", now=job.finished_at),
    )
    send_signal(job_finished, job=job, status=job.status)


def _write_failure(
    job: Job,
    error: str,
    tb: str,
    *,
    worker_id: str,
    using: str,
    patience: timedelta,
    now: datetime,
    backoff: tuple[timedelta | None, timedelta | None],
) -> None:
    """Write the retry (READY at ``now`` + backoff) or, without retries left, the dead letter."""
    if job.attempts > job.max_retries:
        letter = retry_transient(
            lambda: fail_with_dead_letter(
                job,
                worker_id=worker_id,
                using=using,
                reason=f"failed: {job.attempts} attempt(s); {error}"[:2000],
                error=error,
                tb=tb,
                metadata={"attempts": job.attempts},
            ),
            using=using,
            patience=patience,
        )
        if letter is None:
            log_discarded_late_run(job)
        return
    delay = backoff_delay(
        job.attempts,
        backoff[0] or settings.min_backoff,
        backoff[1] or settings.max_backoff,
        jitter=settings.backoff_jitter,
    )
    run_at = now + delay
    updated = retry_transient(
        lambda: _counted_in_breaker(
            job,
            lambda: _write_retry(
                job, worker_id=worker_id, run_at=run_at, error=error, tb=tb, using=using
            ),
            succeeded=False,
            now=now,
            using=using,
        ),
        using=using,
        patience=patience,
    )
    if not updated:
        log_discarded_late_run(job)
        return
    job.status, job.run_at, job.error, job.traceback = Status.READY, run_at, error, tb
    logger.info(
        "job %s (%s) failed attempt %d of %d; retry at %s",
        job.pk,
        job.task_name,
        job.attempts,
        job.max_retries + 1,
        run_at.isoformat(),
        extra=job_fields(job, action="job_retry", outcome="retried", now=now),
    )
    send_signal(job_finished, job=job, status=job.status)


def _write_retry(
    job: Job, *, worker_id: str, run_at: datetime, error: str, tb: str, using: str
) -> int:
    """Put this run's job back READY at ``run_at`` with the run's error; 0 if the run was late."""
    return (
        Job.objects.using(using)
        .current_run(job.pk, attempts=job.attempts, worker_id=worker_id)
        .update(
            status=Status.READY,
            run_at=run_at,
            worker_id="",
            lease_expires_at=None,
            error=error,
            traceback=tb,
        )
    )


def _counted_in_breaker(
    job: Job, write: Callable[[], int], *, succeeded: bool, now: datetime, using: str
) -> int:
    """Run the fenced outcome ``write``; count the run in the task's circuit breaker if it hit.

    The count (:func:`breaker_runs.record_run`, §6) shares the write's
    transaction; a late run (its job reclaimed) counts for nothing.
    """
    task = registry.lookup(job.task_name)
    if task is None or task.options.circuit_breaker is None:
        return write()
    with transaction.atomic(using=using):
        updated = write()
        if updated:
            breaker_runs.record_run(job, succeeded=succeeded, now=now, using=using)
        return updated
