"""The Celery executor: hand due jobs to Celery, and run a handed-off job in a Celery worker (issue #10).

Two halves, both plain functions of the paths layer's calls
(docs/explanation/design.md), so the window and every flow-control decision
stay in the database:

* the scheduler: :func:`dispatch_due` (one round, what the provided Celery
  beat task ``django_debounce.dispatch`` runs) and :class:`Dispatcher` (the
  loop of ``run_debounce_worker --dispatch-only``) claim due jobs for a
  hand-off (:func:`~django_debounce.contrib.celery.handoff.claim_for_handoff`), and after
  the claim commits publish each as one Celery message: task
  ``django_debounce.run_job``, argument the job id, **task id = job id**, no
  ETA, to the Celery queue :func:`celery_queue` maps the job's queue to. A
  publish that fails is logged; the job waits for its hand-off lease to lapse
  and is handed off again (decision 88);
* the Celery side, ``django_debounce.contrib.celery.handed_off`` (re-exported
  here: :func:`take_and_run`, :func:`run_handed_off`, :func:`failed_error`,
  :func:`retry_error`): take the job by id in one conditional statement, run it
  through the built-in worker's run, and return the stored result.

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
from types import FrameType
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections, router
from django.utils import timezone

from ...conf import settings
from ...db_errors import ReconnectBackoff
from ...models import Job
from ...ops.periodic import PeriodicScheduler
from ...ops.sweep import SweepSchedule
from ...run import leases
from ...worker import wakeup
from . import handoff
from .handed_off import failed_error, retry_error, run_handed_off, take_and_run
from .handoff_watch import UntakenWatch
from .routing import RUN_TASK, celery_app, celery_queue, publish

logger = logging.getLogger("django_debounce.celery")

#: The Celery task that runs one dispatch round, for Celery beat.
DISPATCH_TASK = "django_debounce.dispatch"


#: When this process next runs the dead-letter auto-retry sweep (§8, §11): the scheduler runs
#: it, since a deployment on Celery may have no built-in worker to do so.
_sweep_schedule = SweepSchedule()
#: The periodic ticks ``dispatch_due`` defers when called without a scheduler (the beat task).
_periodic = PeriodicScheduler()
#: This process's look-out for hand-offs nobody takes (warned once per job).
_untaken = UntakenWatch()


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
    periodic: PeriodicScheduler | None = None,
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
    built-in worker does on its loop, and, every 2 s, warns about hand-offs
    no Celery worker took 10 s after they were handed off
    (:class:`~django_debounce.contrib.celery.handoff_watch.UntakenWatch`). Once ``stopping``
    is set it claims no more and publishes no more
    (:func:`~django_debounce.contrib.celery.routing.publish`). It first defers
    the due ticks of periodic tasks (``periodic``, default this process's
    scheduler; :mod:`django_debounce.ops.periodic`), so their jobs go out in the same round.

    Raises:
        ConfigurationError: Celery is missing or a setting is invalid.
        DatabaseError: the database failed (jobs claimed so far were published).
    """
    using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    scheduler_id = scheduler_id or default_scheduler_id()
    app = app if app is not None else celery_app()
    queue_list = sorted(set(queues or ()))
    (periodic or _periodic).defer_due()
    leases.reclaim_expired_leases(using=using)
    _sweep_schedule.run_if_due(
        using=using, lease=settings.lease, stopping=threading.Event(), renew=lambda: None
    )
    total = 0
    while total < limit and not (stopping is not None and stopping.is_set()):
        room = min(batch, limit - total)
        claim = handoff.claim_handoff_batch(
            scheduler_id=scheduler_id,
            limit=room,
            lease=settings.celery_handoff_lease,
            queues=queue_list,
            using=using,
        )
        jobs = claim.jobs
        unpublished: list[Job] = []
        if jobs:
            publish(jobs, app=app, stopping=stopping, unpublished=unpublished)
        if unpublished:  # a stop (say, during the claim statement) left them unpublished
            _put_back(unpublished, claim.started_before, scheduler_id=scheduler_id, using=using)
        total += len(jobs) - len(unpublished)
        if len(jobs) < room:
            break
    # Hand-offs no Celery worker took: say so within seconds, not after the lease (decision 153).
    _untaken.run_if_due(
        lease=settings.celery_handoff_lease,
        route=lambda queue: celery_queue(queue, app=app),
        using=using,
    )
    return total


def _put_back(
    jobs: list[Job], started_before: dict[int, Any], *, scheduler_id: str, using: str
) -> None:
    """Put hand-offs a stop left unpublished back to READY as before their claim (decision 169).

    No message of theirs exists, so nobody can take them: waiting for the hand-off lease
    (minutes) would only delay them. A database error is logged; they then wait for it.
    """
    try:
        leases.release_unstarted(
            jobs, started_before, worker_id=handoff.handoff_worker_id(scheduler_id), using=using
        )
    except (DatabaseError, InterfaceError):
        logger.exception(
            "could not put back %d unpublished hand-off(s); each is handed off again once its "
            "hand-off lease lapses",
            len(jobs),
            extra={"action": "release_error"},
        )


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
        periodic: defer the due ticks of periodic tasks each round, and wake for
            the next one (``--no-periodic``: off).
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
        periodic: bool = True,
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
        self._periodic = PeriodicScheduler(scheduler_id=self.scheduler_id, enabled=periodic)
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
        outage = ReconnectBackoff("the dispatcher", logger=logger, using=self.using)
        # An idle dispatcher wakes when a job is enqueued, as the built-in worker does.
        waker = wakeup.start_wakeup(
            self._wake, queues=self.queues, using=self.using, listen=not self.burst
        )
        try:
            while not self._stopping.is_set():
                try:
                    claimed_at = timezone.now()  # what the claim saw of the buckets
                    count = dispatch_due(
                        limit=self.batch,
                        batch=self.batch,
                        queues=self.queues,
                        scheduler_id=self.scheduler_id,
                        using=self.using,
                        app=app,
                        stopping=self._stopping,
                        periodic=self._periodic,
                    )
                    outage.succeeded()
                except (DatabaseError, InterfaceError) as exc:
                    self._stopping.wait(outage.failed(exc))
                    continue
                self.dispatched += count
                if count < self.batch:
                    if self.burst:
                        return self.dispatched
                    # Sleep until the next deadline or bucket refill (decision 170), at most a
                    # poll; a wake-up ends it early.
                    timeout = wakeup.idle_timeout(
                        self.poll_interval,
                        queues=self.queues,
                        using=self.using,
                        free=self.batch,
                        since=claimed_at,
                    )
                    if self._wake.wait(self._periodic.cap_wait(timeout)):
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


__all__ = [
    "DISPATCH_TASK",
    "RUN_TASK",
    "Dispatcher",
    "celery_app",
    "celery_queue",
    "dispatch_due",
    "failed_error",
    "publish",
    "retry_error",
    "run_handed_off",
    "take_and_run",
]
