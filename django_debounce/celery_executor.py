"""The Celery executor: hand due jobs to Celery, and run a handed-off job in a Celery worker (issue #10).

Two halves, both plain functions of the paths layer's calls
(docs/explanation/design.md), so the window and every flow-control decision
stay in the database:

* the scheduler: :func:`dispatch_due` (one round, what the provided Celery
  beat task ``django_debounce.dispatch`` runs) and :class:`Dispatcher` (the
  loop of ``run_debounce_worker --dispatch-only``) claim due jobs for a
  hand-off (:func:`~django_debounce.handoff.claim_for_handoff`), and after
  the claim commits publish each as one Celery message: task
  ``django_debounce.run_job``, argument the job id, **task id = job id**, no
  ETA, to the Celery queue :func:`celery_queue` maps the job's queue to. A
  publish that fails is logged; the job waits for its hand-off lease to lapse
  and is handed off again (decision 88);
* the Celery side: :func:`run_handed_off` takes the job by id in one
  conditional statement (:func:`~django_debounce.handoff.take`), runs it
  through :func:`django_debounce.execution.run_job` (the built-in worker's
  run: signals, result, retries with the task's backoff, dead letters) while
  a keeper thread renews its lease, and returns the stored result.

Celery is imported lazily: importing this module needs no Celery.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterable
from datetime import timedelta
from types import FrameType
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections, router
from django.utils.module_loading import import_string

from . import handoff, leases, wakeup
from .conf import settings
from .exceptions import ConfigurationError, JobFailedError
from .execution import run_job
from .lease_keeper import InlineLeaseKeeper
from .models import Job
from .sweep import SweepSchedule

logger = logging.getLogger("django_debounce.celery")

#: The Celery task a hand-off publishes (registered by :mod:`django_debounce.celery_tasks`).
RUN_TASK = "django_debounce.run_job"
#: The Celery task that runs one dispatch round, for Celery beat.
DISPATCH_TASK = "django_debounce.dispatch"


#: When this process next runs the dead-letter auto-retry sweep (§8, §11): the scheduler runs
#: it, since a deployment on Celery may have no built-in worker to do so.
_sweep_schedule = SweepSchedule()


def celery_app() -> Any:
    """Return the Celery app to publish with: ``DEBOUNCE_CELERY_APP``, else Celery's current app.

    Raises:
        ConfigurationError: Celery is not installed, or ``DEBOUNCE_CELERY_APP``
            does not import (check E029).
    """
    try:
        from celery import current_app
    except ImportError:  # pragma: no cover - the extra is missing
        raise ConfigurationError(
            "the Celery executor needs Celery: pip install 'django-debounce[celery]'."
        ) from None
    path = settings.celery_app
    if not path:
        return current_app._get_current_object()
    try:
        return import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"DEBOUNCE_CELERY_APP={path!r} does not import: {exc}; give the dotted path of your "
            "Celery app, e.g. 'proj.celery.app'."
        ) from exc


def celery_queue(queue: str) -> str:
    """Return the Celery queue a job of debounce queue ``queue`` is published to (decision 89).

    ``DEBOUNCE_CELERY_QUEUES[queue]`` when listed, else the same name.
    """
    return settings.celery_queues.get(queue, queue)


def publish(
    jobs: Iterable[Job], *, app: Any = None, stopping: threading.Event | None = None
) -> tuple[int, int]:
    """Publish one ``django_debounce.run_job`` message per handed-off job; return (sent, failed).

    Each message: argument the job id, task id ``str(job.pk)`` (so Flower and
    ``AsyncResult`` show the job), no ETA (a job is never parked in the
    broker, so no visibility timeout redelivers it early), queue
    :func:`celery_queue`. Call it after the hand-off claim committed. A
    publish that raises is logged (action ``publish_error``) and counted; that
    job waits for its hand-off lease to lapse and is handed off again.

    Args:
        stopping: once set (the dispatcher's SIGTERM), a publish retrying
            through a broker outage gives up at its next retry
            (``task_publish_retry_policy`` otherwise applies), and the jobs not
            yet published are left, counted as failed, to their hand-off lease
            (decision 164): stopping takes about one retry interval, not one
            failing publish per job.
    """
    app = app if app is not None else celery_app()
    policy = {"errback": _give_up_when(stopping)} if stopping is not None else None
    sent = failed = 0
    jobs = list(jobs)
    for index, job in enumerate(jobs):
        if stopping is not None and stopping.is_set():
            failed += len(jobs) - index
            logger.info(
                "stopping: %d handed-off job(s) not published; each is handed off again once "
                "its hand-off lease lapses",
                len(jobs) - index,
                extra={"action": "publish_stopped"},
            )
            break
        try:
            app.send_task(
                RUN_TASK,
                args=[job.pk],
                task_id=str(job.pk),
                queue=celery_queue(job.queue),
                retry_policy=policy,
            )
        except Exception:
            failed += 1
            logger.exception(
                "could not publish job %s (%s) to Celery; it is handed off again once its "
                "hand-off lease lapses",
                job.pk,
                job.task_name,
                extra={"action": "publish_error", "job_id": job.pk},
            )
        else:
            sent += 1
    return sent, failed


def _give_up_when(stopping: threading.Event) -> Any:
    """Return a kombu retry ``errback`` that re-raises the broker's error once ``stopping`` is set."""

    def errback(exc: BaseException, interval: float) -> None:
        if stopping.is_set():
            raise exc

    return errback


def default_scheduler_id() -> str:
    """Return a scheduler identity: host:pid:random."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def dispatch_due(
    *,
    limit: int = 1000,
    batch: int = 100,
    queues: Iterable[str] | None = None,
    scheduler_id: str | None = None,
    using: str | None = None,
    app: Any = None,
    stopping: threading.Event | None = None,
) -> int:
    """Hand every due job of Celery-executor tasks to Celery, up to ``limit``; return how many.

    One dispatch round: reclaim lapsed leases (hand-offs nobody took go back
    to READY), then claim ``batch`` jobs at a time for a hand-off under
    ``DEBOUNCE_CELERY_HANDOFF_LEASE`` and publish each after its claim
    committed (:func:`publish`), until a claim comes back short or ``limit``
    jobs were claimed. What the Celery beat task ``django_debounce.dispatch``
    runs; safe to run from several schedulers at once (the claim skips rows
    another one holds). Also runs the dead-letter auto-retry sweep when it
    is due in this process (``DEBOUNCE_DEAD_LETTER_AUTO_RETRY``, §8), as a
    built-in worker does on its loop. Once ``stopping`` is set it claims no
    more and publishes no more (:func:`publish`).

    Raises:
        ConfigurationError: Celery is missing or a setting is invalid.
        DatabaseError: the database failed (jobs claimed so far were published).
    """
    using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    scheduler_id = scheduler_id or default_scheduler_id()
    app = app if app is not None else celery_app()
    queue_list = sorted(set(queues or ()))
    leases.reclaim_expired_leases(using=using)
    _sweep_schedule.run_if_due(
        using=using, lease=settings.lease, stopping=threading.Event(), renew=lambda: None
    )
    total = 0
    while total < limit and not (stopping is not None and stopping.is_set()):
        room = min(batch, limit - total)
        jobs = handoff.claim_for_handoff(
            scheduler_id=scheduler_id,
            limit=room,
            lease=settings.celery_handoff_lease,
            queues=queue_list,
            using=using,
        )
        if jobs:
            publish(jobs, app=app, stopping=stopping)
        total += len(jobs)
        if len(jobs) < room:
            break
    return total


class Dispatcher:
    """The loop of ``run_debounce_worker --dispatch-only``: dispatch rounds until stopped.

    Args:
        queues: debounce queues to dispatch; ``None`` or empty: every queue.
        batch: jobs claimed per claim (≥ 1).
        poll_interval: seconds between rounds when nothing was due
            (``DEBOUNCE_POLL_INTERVAL``); a round that filled its batch is
            followed by the next at once.
        burst: dispatch every job due now, then return.
        scheduler_id: identity (default host:pid:random).
        handle_signals: SIGTERM/SIGINT stop the loop (main thread only).
        using: database alias.
    """

    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        batch: int = 100,
        poll_interval: float | None = None,
        burst: bool = False,
        scheduler_id: str | None = None,
        handle_signals: bool = True,
        using: str | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch={batch} must be at least 1")
        self.queues = sorted(set(queues or ()))
        self.batch = batch
        self.poll_interval = settings.poll_interval if poll_interval is None else poll_interval
        self.burst = burst
        self.scheduler_id = scheduler_id or default_scheduler_id()
        self.handle_signals = handle_signals
        self.using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
        self.dispatched = 0
        self._stopping = threading.Event()
        # Set by the wake-up (LISTEN/NOTIFY or Redis, docs/howto/wakeup.md) and by stop().
        self._wake = threading.Event()

    def stop(self) -> None:
        """Stop after the current round."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        logger.info("signal %s: stopping the dispatcher", signum, extra={"action": "shutdown"})
        self.stop()

    def run(self) -> int:
        """Dispatch until stopped (or, with ``burst``, until nothing is due); return jobs dispatched."""
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        app = celery_app()
        logger.info(
            "dispatcher %s starting: queues=%s batch=%s",
            self.scheduler_id,
            self.queues or "all",
            self.batch,
            extra={"action": "start_dispatcher"},
        )
        failures = 0
        # An idle dispatcher wakes when a job is enqueued, as the built-in worker does.
        waker = wakeup.start_wakeup(
            self._wake, queues=self.queues, using=self.using, listen=not self.burst
        )
        try:
            while not self._stopping.is_set():
                try:
                    count = dispatch_due(
                        limit=self.batch,
                        batch=self.batch,
                        queues=self.queues,
                        scheduler_id=self.scheduler_id,
                        using=self.using,
                        app=app,
                        stopping=self._stopping,
                    )
                    failures = 0
                except (DatabaseError, InterfaceError) as exc:
                    failures += 1
                    delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                    logger.error(
                        "database error in the dispatcher (%s); reconnecting in %.1fs",
                        exc,
                        delay,
                        extra={"action": "db_error"},
                    )
                    connections[self.using].close()
                    self._stopping.wait(delay)
                    continue
                self.dispatched += count
                if count < self.batch:
                    if self.burst:
                        return self.dispatched
                    # Sleep until the next deadline, at most a poll; a wake-up ends it early.
                    timeout = wakeup.idle_timeout(
                        self.poll_interval, queues=self.queues, using=self.using
                    )
                    if self._wake.wait(timeout):
                        self._wake.clear()
        finally:
            waker.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            connections[self.using].close()
            logger.info(
                "dispatcher %s stopped after %d hand-off(s)",
                self.scheduler_id,
                self.dispatched,
                extra={"action": "stop_dispatcher"},
            )
        return self.dispatched


def run_handed_off(job_id: int, *, using: str | None = None) -> object:
    """Run the handed-off job ``job_id`` in this (Celery worker) process; return its stored result.

    Takes the job (:func:`~django_debounce.handoff.take`: one conditional
    statement); a message that finds nothing to take (a duplicate or late
    message, a job cancelled, expired, already run or handed off again) is
    logged at INFO (action ``noop``) and returns ``None``. Otherwise runs it
    through :func:`~django_debounce.execution.run_job` under a lease of
    ``DEBOUNCE_LEASE`` that a keeper thread renews every third of it, so a
    Celery worker that dies mid-job stops renewing and the job runs again
    after its lease (at least once, §7). Returns the job's stored result,
    or ``None`` when this attempt failed and a retry is scheduled (the job is
    READY again with its error).

    Raises:
        JobFailedError: this attempt ended the job FAILED (retries exhausted,
            or its task is unknown here: ``unknown_task:``); raised after the
            dead letter is written, so the Celery task ends in FAILURE
            (decision 138).
    """
    using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    worker_id = f"celery:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
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
        return None

    def renew() -> None:
        leases.renew_leases([job.pk], worker_id=worker_id, lease=lease, using=using)

    with InlineLeaseKeeper(renew, lease) as keeper, keeper.running():
        run_job(job, worker_id=worker_id, using=using, retry_for=lease)
    if job.status == Job.Status.FAILED:
        # Raised only now: the job's outcome (its dead letter) is already written (decision 138).
        error_line = (job.error or "").strip().splitlines()[-1:] or ["no error recorded"]
        raise JobFailedError(
            f"job {job.pk} ({job.task_name}) failed for good on attempt {job.attempts}: "
            f"{error_line[0]}; its dead letter is written (`manage.py retry_dead_letters` "
            "runs it again)"
        )
    return job.result if job.status == Job.Status.SUCCESSFUL else None


__all__ = [
    "DISPATCH_TASK",
    "RUN_TASK",
    "Dispatcher",
    "celery_app",
    "celery_queue",
    "dispatch_due",
    "publish",
    "run_handed_off",
]
