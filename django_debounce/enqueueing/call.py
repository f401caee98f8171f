"""Enqueue: plan a call, then slide-or-insert atomically (contract §2–§5).

An enqueue is planned first (:func:`~django_debounce.enqueueing.planning.plan_call`:
options, key, payload, every error raised before any SQL runs, §3) and then
written in one short transaction (:func:`write`):

* debounced: lock the open window of (task, key) with ``SELECT … FOR UPDATE``
  and slide it, or insert a new one. The unique ``window_key`` column makes a
  racing second insert fail, and the loser retries and slides instead (§4.4);
* coalesced (``unique_key``/``idempotent``): return the READY/RUNNING job that
  holds the unique lock, or insert;
* plain: insert.

This module reads the registry, never :mod:`django_debounce.tasks` (which calls it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NoReturn

from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    transaction,
)
from django.utils import timezone

from .. import databases, lifecycle, registry, tracing
from ..conf import settings
from ..db_errors import is_contention
from ..exceptions import ConfigurationError, EnqueueContentionError
from ..job_ids import storable_ids
from ..lifecycle import CANCELLING_STATUSES
from ..log_fields import job_fields, jobs_fields
from ..models import Job, JobDependency
from ..options import Plan
from ..registry import RegisteredTask
from ..schema_ready import not_migrated
from ..signals import job_enqueued, send_signal
from ..validators import check_task_name
from . import savepoints, upsert
from .contention import contended
from .edges import EdgeRaceError, write_edge
from .planning import plan_call
from .rows import apply_slide, new_job

__all__ = [
    "Plan",
    "apply_slide",
    "contended",
    "enqueue",
    "enqueue_call",
    "is_contention",
    "new_job",
    "plan_call",
    "write",
]

#: The logger keeps the name of the module this one was (``core``): operators'
#: ``LOGGING`` routes it, and docs/reference/commands.md names it.
logger = logging.getLogger("django_debounce.core")


def enqueue(
    task_name: str,
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    **options: object,
) -> Job:
    """Enqueue a call of the task registered as ``task_name`` (§2).

    Works from a process that never imported the task: then only the call's
    own options apply, and ``{N}``/``{name}`` in a key template are
    ``args[N]``/``kwargs[name]`` as given (§3).

    Args:
        task_name: the task's registered name.
        args: positional arguments (sequence).
        kwargs: keyword arguments (mapping with ``str`` keys).
        **options: per-call options, as for :meth:`Task.apply_async`.

    Returns:
        The job after this enqueue, with ``outcome`` set.

    Raises:
        ConfigurationError: as for :meth:`Task.apply_async`; also a task name
            that is not a non-empty ``str`` of at most 255 characters without
            NUL or lone surrogates (``Job.task_name``), raised before any SQL.
        KeyResolutionError, PayloadError, EnqueueContentionError,
            NotMigratedError: as for :meth:`Task.apply_async`.
    """
    if not isinstance(task_name, str) or not task_name:
        raise ConfigurationError(f"enqueue() needs a task name (str), got {task_name!r}.")
    check_task_name(task_name)
    return enqueue_call(registry.lookup(task_name), task_name, args, kwargs or {}, options)


def enqueue_call(
    task: RegisteredTask | None,
    task_name: str,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    options: Mapping[str, object],
) -> Job:
    """Plan and write one call (the shared path of ``delay``, ``apply_async``, ``enqueue``).

    Args:
        task: the registered task, or ``None`` for a task this process never imported.
        task_name: the task's name.
        args, kwargs: the call's arguments, as given.
        options: the call's own options (any of :data:`~django_debounce.options.CALL_OPTIONS`).

    Raises:
        ConfigurationError: ``USE_TZ = False`` (check E011): ``timezone.now()``
            would be a naive local time, and every deadline stored with it
            would move with the clocks (§4.7). Also see ``apply_async``.
    """
    if not settings.use_tz:
        refuse_without_tz(f"enqueue of {task_name!r}")
    now = timezone.now()
    plan = plan_call(task, task_name, args, kwargs, options, now)
    tracer = tracing.tracer()  # None while tracing is off (decision 211): the plain write
    if tracer is None:
        job = write(plan, now)
    else:
        from ..tracing.spans import traced_enqueue

        job = traced_enqueue(tracer, plan, lambda: write(plan, now))
    logger.debug(
        "enqueued job %s (%s): %s",
        job.pk,
        task_name,
        job.outcome,
        extra=job_fields(job, action="enqueue", outcome=job.outcome),
    )
    send_signal(job_enqueued, job=job, outcome=job.outcome)
    return job


def refuse_without_tz(what: str) -> NoReturn:
    """Raise the ``ConfigurationError`` of an enqueue (``what``) under ``USE_TZ = False`` (E011)."""
    raise ConfigurationError(
        f"{what} refused: django_debounce needs USE_TZ = True (system "
        "check django_debounce.E011). With USE_TZ = False deadlines would be stored as "
        "naive local times, which the worker refuses to run against; set USE_TZ = True."
    )


class _StaleWindowError(Exception):
    """The key's open window (or coalescing job) is past its expiry: end it, then retry."""


def write(plan: Plan, now: datetime, using: str | None = None) -> Job:
    """Write ``plan`` atomically, retrying lost races and lock waits (§4.4).

    Raises:
        EnqueueContentionError: the retry budget (``DEBOUNCE_ENQUEUE_RETRIES``)
            ran out; nothing was written.
        NotMigratedError: the database has no django_debounce tables
            (``migrate`` not run), chained from the driver's error.
    """
    # The router is told the job's queue and task: a router may route queues (decision 224).
    db = using or databases.for_job(plan.queue, plan.task_name)
    try:
        return _write_retrying(plan, now, db)
    except DatabaseError as exc:
        error = not_migrated(exc, db, f"enqueue of {plan.task_name!r}")
        if error is None:
            raise
        raise error from exc


def _write_retrying(plan: Plan, now: datetime, db: str) -> Job:
    """The body of :func:`write`: the attempts, each atomic, within the retry budget."""
    budget = max(1, settings.enqueue_retries)
    last: Exception | None = None
    # One INSERT … ON CONFLICT slides or opens the window (no read, no row lock first).
    by_upsert = _by_upsert(plan, db)
    # Dependency edges are written beside the job, and a leading or both edge reads
    # its burst before writing (decision 180), so such a call needs a transaction.
    one_statement = not plan.depends_on and (
        by_upsert or (plan.window_key is None and plan.unique_lock is None)
    )
    in_caller = transaction.get_connection(db).in_atomic_block
    # Inside the caller's transaction, a savepoint only where the call may need to roll
    # back alone (decision 205): two round trips saved on every other call.
    bare = in_caller and not savepoints.needs_savepoint(plan, db, by_upsert)
    for attempt in range(budget):
        try:
            if bare:
                # One row's write whose failure leaves nothing of it behind.
                return _write_atomic(plan, now, db, by_upsert)
            if one_statement and not in_caller:
                # One statement is atomic on its own: no BEGIN/COMMIT round trips.
                job = _write_atomic(plan, now, db, by_upsert)
            else:
                with transaction.atomic(using=db):  # a savepoint inside the caller's transaction
                    job = _write_atomic(plan, now, db, by_upsert)
            savepoints.mark_written(db)
            return job
        except _StaleWindowError:
            expire_stale(plan, now, db)
            continue
        except EdgeRaceError:
            continue
        except (IntegrityError, OperationalError) as exc:
            last = contended(exc, f"enqueue of {plan.task_name!r}", "this call", db, attempt)
    raise EnqueueContentionError(
        f"enqueue of {plan.task_name!r} gave up after {budget} attempts under lock contention; "
        "nothing was written. Retry the call, or raise DEBOUNCE_ENQUEUE_RETRIES."
    ) from last


def _write_atomic(plan: Plan, now: datetime, db: str, by_upsert: bool) -> Job:
    """Write ``plan`` inside a transaction: its dependencies locked, then slid or inserted."""
    dependency_failed = _lock_dependencies(plan, db) if plan.depends_on else False
    if plan.edge != "trailing" and plan.window_key is not None:
        job = write_edge(plan, now, db)
    elif by_upsert:
        job = _slide_or_insert(plan, now, db)
    else:
        job = _write_once(plan, now, db)
    if plan.depends_on and job.outcome == "created":
        _link_dependencies(job, plan, now, db, dependency_failed)
    return job


def write_locked(plan: Plan, now: datetime, db: str) -> Job:
    """Write ``plan`` inside the transaction the caller holds (the bulk path), without retrying.

    A stale open window (or coalescing job) is ended EXPIRED and the call then
    opens a new one, as :func:`write` does. Contention errors propagate: the
    caller retries its whole transaction.
    """
    by_upsert = _by_upsert(plan, db)
    while True:
        try:
            with transaction.atomic(using=db):
                return _write_atomic(plan, now, db, by_upsert)
        except _StaleWindowError:
            expire_stale(plan, now, db)
        except EdgeRaceError:
            continue


def _by_upsert(plan: Plan, db: str) -> bool:
    """True when one ``INSERT … ON CONFLICT`` writes the call: a trailing window, no merge."""
    return (
        plan.window_key is not None
        and plan.merge is None
        and plan.edge == "trailing"
        and upsert.supported(db)
    )


def _lock_dependencies(plan: Plan, db: str) -> bool:
    """Lock the rows of ``plan.depends_on`` and return True if one already ended without success.

    The lock (``SELECT … FOR UPDATE``, in id order) makes a dependency's own
    final write wait until this enqueue commits, so the dependency's
    :func:`~django_debounce.lifecycle.cancel_dependents` then sees the new
    edge: a job can never be left waiting on a dependency that failed
    meanwhile (§6).

    Raises:
        ConfigurationError: an id names no job (nothing has been written).
    """
    found = dict(
        Job.objects.using(db)
        .select_for_update()
        # An id past the 64-bit range names no job (and SQLite cannot even bind it).
        .filter(pk__in=storable_ids(plan.depends_on))
        .order_by("pk")
        .values_list("pk", "status")
    )
    missing = [pk for pk in plan.depends_on if pk not in found]
    if missing:
        raise ConfigurationError(
            f"enqueue of {plan.task_name!r}: depends_on names job id(s) {missing} that do not "
            "exist; pass jobs returned by an enqueue."
        )
    return any(status in CANCELLING_STATUSES for status in found.values())


def _link_dependencies(
    job: Job, plan: Plan, now: datetime, db: str, dependency_failed: bool
) -> None:
    """Write the new job's dependency edges; cancel it at once if a dependency already failed.

    Only a call that created the job stores its dependencies: a slide keeps
    the opener's (§4.2) and a coalesced call returns the existing job. A job
    created after one of its dependencies ended FAILED, SHED, CANCELLED or
    EXPIRED is created CANCELLED, as it would have been had it existed then (§6).
    """
    JobDependency.objects.using(db).bulk_create(
        [JobDependency(job_id=job.pk, dependency_id=pk) for pk in plan.depends_on]
    )
    if dependency_failed:
        lifecycle.cancel_ready([job.pk], now=now, using=db)
        job.status, job.finished_at = Job.Status.CANCELLED, now
        job.window_key = job.unique_lock = None
        logger.info(
            "job %s (%s) created CANCELLED: a dependency had already ended without success",
            job.pk,
            job.task_name,
            extra=job_fields(job, action="cancel_dependents", outcome="cancelled"),
        )


def _slide_or_insert(plan: Plan, now: datetime, db: str) -> Job:
    job = upsert.slide_or_insert(plan, now, db)
    if job is None:
        raise _StaleWindowError
    return job


def _is_stale(job: Job, now: datetime) -> bool:
    """True for a READY job already past its expiry: it will never run, so it takes no calls."""
    return job.status == Job.Status.READY and job.expires_at is not None and job.expires_at <= now


def expire_stale(plan: Plan, now: datetime, db: str) -> None:
    """End the key's stale open window (or coalescing job) EXPIRED, cancelling its dependents.

    The worker would do the same at its next claim (§6, §11); doing it here lets
    the call open a new window instead of sliding into one that will never run.
    """
    with transaction.atomic(using=db):
        qs = (
            Job.objects.using(db)
            .select_for_update()
            .filter(status=Job.Status.READY, expires_at__lte=now)
        )
        if plan.window_key is not None:
            qs = qs.filter(window_key=plan.window_key)
        else:
            qs = qs.filter(unique_lock=plan.unique_lock)
        ids = list(qs.values_list("pk", flat=True))
        if not ids:
            return  # a worker expired or claimed it meanwhile
        lifecycle.expire(ids, now=now, using=db)
    logger.info(
        "job(s) %s expired before a worker started them; the new call opens a new job",
        ids,
        extra=jobs_fields(ids, action="expire", outcome="expired"),
    )


def _write_once(plan: Plan, now: datetime, db: str) -> Job:
    if plan.window_key is not None:
        found = list(
            Job.objects.using(db).select_for_update().filter(window_key=plan.window_key)[:1]
        )
        if found:
            if _is_stale(found[0], now):
                raise _StaleWindowError
            return _slide(found[0], plan, now, db)
    elif plan.unique_lock is not None:
        found = list(
            Job.objects.using(db).select_for_update().filter(unique_lock=plan.unique_lock)[:1]
        )
        if found:
            if _is_stale(found[0], now):
                raise _StaleWindowError
            found[0].outcome = "coalesced"
            return found[0]
    job = new_job(plan, now)
    if not upsert.insert(job, db):
        job.save(force_insert=True, using=db)
    job.outcome = "created"
    return job


def _slide(job: Job, plan: Plan, now: datetime, db: str) -> Job:
    """Slide an open window (§4.2) and save the fields that moved."""
    job.save(update_fields=apply_slide(job, plan, now), using=db)
    job.outcome = "debounced"
    return job
