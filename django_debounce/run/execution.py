"""Run one claimed job: call its task, then record what happened (contract §7, §11).

:func:`run_job` is what an executor calls for each job it claimed
(:func:`django_debounce.claim.claiming.claim_jobs`), in the thread that runs it; the
built-in worker calls it from its loop or its job threads. The task runs
outside any transaction; the outcome is written by :mod:`django_debounce.run.outcomes`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections, transaction

from .. import codec, registry, tracing
from ..context import JobContext
from ..exceptions import JobCancelled
from ..log_fields import job_fields
from ..models import Job
from ..run_controls import RunControl
from ..signals import job_started, send_signal
from . import outcomes
from .cancelled_runs import record_cancelled
from .interrupts import is_host_stop
from .limited_calls import call_task, control_for
from .storable import format_error, format_traceback, storable_result
from .success_batches import SuccessBatch
from .unknown_tasks import handle_unknown_task

if TYPE_CHECKING:
    from ..tracing.spans import RunSpan

#: The worker's documented logger (docs/reference/commands.md): run lines keep its name.
logger = logging.getLogger("django_debounce.worker")


def run_job(
    job: Job,
    *,
    worker_id: str,
    using: str,
    retry_for: timedelta | None = None,
    successes: SuccessBatch | None = None,
    on_control: Callable[[RunControl], None] | None = None,
) -> None:
    """Run the claimed ``job``'s task and record the outcome; never raises for the task's error.

    A job whose task is not registered here is put back while
    ``DEBOUNCE_UNKNOWN_TASK_GRACE`` lasts, else buried as ``unknown_task:``
    (:func:`~django_debounce.run.unknown_tasks.handle_unknown_task`). Otherwise
    ``job_started`` is sent, the arguments decoded (a ``takes_context`` task
    gets a :class:`~django_debounce.context.JobContext` first), the task called
    (an async one through ``async_to_sync``) and its return value recorded
    (:func:`~django_debounce.run.outcomes.record_success`), or what it raised
    (:func:`~django_debounce.run.outcomes.record_failure`: a retry or a dead letter),
    ``BaseException`` subclasses included: a task that calls ``sys.exit(3)`` or
    raises ``KeyboardInterrupt`` or ``asyncio.CancelledError`` has failed, with
    the error ``"SystemExit: 3"`` (decision 150), and the calling thread goes on.

    Inside a caller's transaction (an inline ``--burst`` in a test, say) the
    task runs after a savepoint: a database error in the task rolls back to
    it, so the caller's transaction stays usable and the outcome can be
    recorded; any other exception keeps the task's writes, as in autocommit.

    Args:
        job: a job claimed for ``worker_id`` (RUNNING, as the claim returned it).
        worker_id: the id it was claimed under.
        using: database alias.
        retry_for: how long outcome writes retry through transient database
            errors (default ``DEBOUNCE_LEASE``; the worker passes its lease).
        successes: where a plain success waits for its batched write
            (:class:`~django_debounce.run.success_batches.SuccessBatch`; its
            ``job_finished`` is sent after that write). ``None`` writes it at
            once. A failure, and a success of a task with a circuit breaker,
            are always written at once (decision 120).
        on_control: called with the run's
            :class:`~django_debounce.run_controls.RunControl` just before the
            task starts (the built-in worker watches its hard limit through it).

    A job whose cancel was requested (``cancel_requested_at``, decision 186)
    ends CANCELLED when its task raises
    :class:`~django_debounce.exceptions.JobCancelled` (its context's
    ``checkpoint()``; an async task cancelled by the watcher) or raises
    anything else after the request; one claimed with the request already
    made ends CANCELLED without running. A timed-out run (``timeout``,
    decision 187) fails with :class:`~django_debounce.exceptions.JobTimeout`,
    retried or dead-lettered by the task's policy.

    Raises:
        OperationalError, InterfaceError: the outcome could not be written for
            ``retry_for``: the job stays RUNNING until its lease lapses.
        SystemExit: only a subclass a signal handler raised to end the process
            (:func:`~django_debounce.run.interrupts.is_host_stop`: the worker's second
            signal, Celery's cold shutdown): nothing is recorded, and the job runs
            again once its lease lapses.

    While tracing is on (decision 213) the run is a span linked to the calls
    the job carries, current while the task runs.
    """
    tracer = tracing.tracer()
    if tracer is None:
        _run(job, worker_id, using, retry_for, successes, on_control, None)
        return
    from ..tracing.spans import run_span

    span = run_span(tracer, job)  # None: the SDK raised making it (logged, decision 227)
    if span is None:
        _run(job, worker_id, using, retry_for, successes, on_control, None)
        return
    with span:
        _run(job, worker_id, using, retry_for, successes, on_control, span)


def _run(
    job: Job,
    worker_id: str,
    using: str,
    retry_for: timedelta | None,
    successes: SuccessBatch | None,
    on_control: Callable[[RunControl], None] | None,
    span: RunSpan | None,
) -> None:
    """The body of :func:`run_job`; ``span`` (tracing on) hears what the task did."""
    task = registry.lookup(job.task_name)
    if task is None:
        handle_unknown_task(job, worker_id=worker_id, using=using, retry_for=retry_for)
        return
    logger.info(
        "running job %s (%s), attempt %d",
        job.pk,
        job.task_name,
        job.attempts,
        extra=job_fields(job, action="start_job", outcome="started"),
    )
    control = control_for(job, task, using=using)
    if control.cancel_known:  # a cancel requested before this attempt started: it never runs
        record_cancelled(job, worker_id=worker_id, using=using, retry_for=retry_for)
        return
    if on_control is not None:
        on_control(control)
    send_signal(job_started, job=job)
    try:
        args, kwargs = codec.decode_call(job.args, job.kwargs)
        if task.options.takes_context:  # Django's takes_context: the context comes first
            args = [JobContext.for_job(job, control), *args]
        connection = connections[using]
        # transaction.savepoint() is deprecated in Django 6.1: the connection's own method.
        savepoint = connection.savepoint() if connection.in_atomic_block else None
        try:
            result = call_task(task, args, kwargs, control)
        except DatabaseError:
            if savepoint:
                # Django marked the transaction broken; clear the mark so that the
                # ROLLBACK TO SAVEPOINT can run (the documented manual-savepoint dance).
                transaction.set_rollback(False, using=using)
                transaction.savepoint_rollback(savepoint, using=using)
            raise
        if savepoint:
            transaction.savepoint_commit(savepoint, using=using)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the run's error
        if is_host_stop(exc):
            raise  # a signal handler ending the process, not the task (decision 150)
        if span is not None:
            span.raised(exc)
        control.progress.flush()  # the last value reported, before the outcome (decision 203)
        if isinstance(exc, JobCancelled) or _cancel_requested(control):
            # Stopped on request, or failed after it: CANCELLED, never retried (decision 186).
            error, tb = format_error(exc), format_traceback(exc)
            record_cancelled(
                job, worker_id=worker_id, using=using, error=error, tb=tb, retry_for=retry_for
            )
            return
        logger.exception(
            "job %s (%s) raised",
            job.pk,
            job.task_name,
            extra=job_fields(job, action="job_error", outcome="raised"),
        )
        outcomes.record_failure(
            job,
            exc,
            worker_id=worker_id,
            using=using,
            min_backoff=task.options.min_backoff,
            max_backoff=task.options.max_backoff,
            retry_for=retry_for,
        )
    else:
        if span is not None:
            span.returned()
        control.progress.flush()
        if successes is not None and task.options.circuit_breaker is None:
            successes.add(job, storable_result(result), result, worker_id=worker_id)
        else:
            outcomes.record_success(
                job, result, worker_id=worker_id, using=using, retry_for=retry_for
            )


def _cancel_requested(control: RunControl) -> bool:
    """Read the run's cancel mark after a failure (a read error counts as no request)."""
    try:
        return control.read_cancel()
    except (DatabaseError, InterfaceError):
        return False


__all__ = ["run_job"]
