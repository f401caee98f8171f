"""The worker: the loop that claims due jobs, runs them and records the outcome (contract §7, §11).

:class:`Worker` takes keyword-only options (the ``run_debounce_worker``
command only maps its flags onto it). This module is the loop alone: threads,
lease keeping, signal handling and shutdown. It claims with
:func:`django_debounce.claim.claim_batch`, runs each job with
:func:`django_debounce.execution.run_job` (which records the outcome through
:mod:`django_debounce.outcomes`, fenced on the run, §11) and keeps leases with
:mod:`django_debounce.leases`. Tasks run outside any transaction.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    close_old_connections,
    connections,
    router,
)

from . import leases, outcomes, wakeup
from .claim import claim_batch
from .conf import settings
from .connection_upkeep import close_dropped_connections, upkeep_loop_connection
from .execution import run_job
from .lease_keeper import InlineLeaseKeeper
from .models import Job
from .sweep import SweepSchedule

logger = logging.getLogger("django_debounce.worker")

#: Claims a worker makes in a row when each loses to lock contention (``claim_batch``'s
#: ``attempts``): contention is not a database outage.
CLAIM_ATTEMPTS = 5

Status = Job.Status


class Worker:
    """Run due jobs until stopped (or, with ``burst``, until none is due).

    Args:
        queues: queue names to serve; ``None`` or empty serves every queue.
        concurrency: threads running jobs (≥ 1). Each holds at most one
            database connection; the loop holds one more for claims and
            lease renewal.
        burst: run every job due and runnable now, then return (§11). Jobs
            held back (a run of the same key in flight on another worker, a
            rate limit without a token, a full concurrency cap, an open circuit
            breaker) are not waited for. With ``concurrency=1`` the jobs run in the calling
            thread.
        max_jobs: stop after claiming this many jobs.
        poll_interval: seconds between polls when idle (``DEBOUNCE_POLL_INTERVAL``).
        lease: claim lease (``DEBOUNCE_LEASE``); renewed every third of it.
        shutdown_grace: how long a stop waits for running jobs (``DEBOUNCE_SHUTDOWN_GRACE``).
        worker_id: identity recorded on claimed jobs (default host:pid:random).
        handle_signals: install SIGTERM/SIGINT handlers (main thread only).
        using: database alias.
    """

    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        lease: timedelta | None = None,
        shutdown_grace: timedelta | None = None,
        worker_id: str | None = None,
        handle_signals: bool = True,
        using: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency} must be at least 1")
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs={max_jobs} must be at least 1")
        self.queues = sorted(set(queues or ()))
        self.concurrency = concurrency
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = settings.poll_interval if poll_interval is None else poll_interval
        self.lease = lease or settings.lease
        self.shutdown_grace = (
            shutdown_grace if shutdown_grace is not None else settings.shutdown_grace
        )
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.handle_signals = handle_signals
        self.using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
        self.processed = 0
        self._claimed_total = 0
        self._next_maintenance = 0.0
        self._sweep_schedule = SweepSchedule()
        self._idle = True
        self._stopping = threading.Event()
        self._signals_seen = 0
        # Set when a job ends or on stop: the loop's wait between polls ends early.
        self._wake = threading.Event()
        self._work: queue_module.Queue[Job | None] = queue_module.Queue()
        self._in_flight: dict[int, Job] = {}
        # Claimed jobs not started yet: their started_at from before the claim (to put back).
        self._started_before: dict[int, datetime | None] = {}
        self._lock = threading.Lock()
        self._loop_used_at = 0.0  # monotonic time the threaded loop last used its connection

    # -- control -----------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self._signals_seen > 1:
            logger.warning("second signal %s: exiting now", signum, extra={"action": "abort"})
            raise SystemExit(1)
        logger.info(
            "signal %s: finishing running jobs (grace %ss), claiming no more",
            signum,
            self.shutdown_grace.total_seconds(),
            extra={"action": "shutdown"},
        )
        self.stop()

    def run(self) -> int:
        """Run until stopped, ``max_jobs`` reached or (burst) nothing is due; return jobs run."""
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        logger.info(
            "worker %s starting: queues=%s concurrency=%s burst=%s",
            self.worker_id,
            self.queues or "all",
            self.concurrency,
            self.burst,
            extra={"action": "start_worker"},
        )
        try:
            if self.burst and self.concurrency == 1:
                self._run_inline()
            else:
                self._run_threaded()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if not connections[self.using].in_atomic_block:
                connections[self.using].close()
        logger.info(
            "worker %s stopped after %d job(s)",
            self.worker_id,
            self.processed,
            extra={"action": "stop_worker"},
        )
        return self.processed

    # -- modes -------------------------------------------------------------------
    def _claim_capacity(self) -> int:
        """Return how many jobs to claim now: free threads, capped by ``max_jobs``."""
        free = self.concurrency - len(self._in_flight)
        if self.max_jobs is None:
            return free
        return max(0, min(free, self.max_jobs - self._claimed_total))

    def _maintain(self) -> None:
        """Reclaim lapsed leases (at start, then at most once per poll interval)."""
        if time.monotonic() < self._next_maintenance:
            return
        with self._lock:
            running = list(self._in_flight)
        leases.reclaim_expired_leases(using=self.using, exclude_ids=running)
        self._next_maintenance = time.monotonic() + min(self.poll_interval, 1.0)
        self._sweep()

    def _sweep(self) -> None:
        """Run the dead-letter auto-retry sweep when due (:class:`~django_debounce.sweep.SweepSchedule`)."""
        self._sweep_schedule.run_if_due(
            using=self.using, lease=self.lease, stopping=self._stopping, renew=self._renew_leases
        )

    def _claim(self, limit: int) -> list[Job]:
        """Claim up to ``limit`` jobs, claiming again after lock contention (``CLAIM_ATTEMPTS``)."""
        claim = claim_batch(
            worker_id=self.worker_id,
            limit=limit,
            lease=self.lease,
            queues=self.queues,
            using=self.using,
            peek=self._idle,
            attempts=CLAIM_ATTEMPTS,
        )
        with self._lock:
            self._started_before.update(claim.started_before)
        # After a short batch the queue is probably drained: peek before locking next time.
        self._idle = len(claim.jobs) < limit
        return claim.jobs

    def _may_start(self, job: Job) -> bool:
        """Return True if the claimed ``job`` starts now; once stopping, put it back (§7).

        Called where a claimed job is handed to :meth:`_process`: a stop that
        arrived while the job was being claimed, or before a thread took it,
        leaves it unstarted, so it goes back to READY at once
        (:meth:`_release`) instead of running into the grace period.
        """
        if self._stopping.is_set():
            self._release([job])
            return False
        with self._lock:
            self._started_before.pop(job.pk, None)
        return True

    def _release(self, jobs: Sequence[Job]) -> None:
        """Put claimed, unstarted ``jobs`` back as before their claim (:func:`~django_debounce.leases.release_unstarted`).

        A database error is logged, not raised: the jobs then stay RUNNING until
        their lease lapses and are run again after it, as after a crash (§7).
        """
        with self._lock:
            before = {job.pk: self._started_before.pop(job.pk, None) for job in jobs}
        try:
            leases.release_unstarted(jobs, before, worker_id=self.worker_id, using=self.using)
        except (DatabaseError, InterfaceError):
            logger.exception(
                "could not put back %d claimed job(s) that had not started; they run again "
                "once their lease lapses",
                len(jobs),
                extra={"action": "release_error"},
            )
            if not connections[self.using].in_atomic_block:
                connections[self.using].close()

    def _run_inline(self) -> None:
        with InlineLeaseKeeper(self._renew_leases, self.lease) as keeper:
            self._maintain()
            while not self._stopping.is_set() and self._claim_capacity() > 0:
                jobs = self._claim(1)
                if not jobs:
                    return
                job = jobs[0]
                if not self._may_start(job):  # stopped during the claim
                    return
                self._claimed_total += 1
                with self._lock:
                    self._in_flight[job.pk] = job
                try:
                    with keeper.running():
                        self._process(job)
                finally:
                    with self._lock:
                        self._in_flight.pop(job.pk, None)

    def _run_threaded(self) -> None:
        threads = [
            threading.Thread(target=self._thread_main, name=f"debounce-job-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        renew_every = self.lease.total_seconds() / 3
        next_renew = time.monotonic() + renew_every
        failures = 0
        idle = True  # the last poll claimed nothing and no job was running
        # Wakes the loop when a job is enqueued (LISTEN/NOTIFY or Redis; decision 80).
        waker = wakeup.start_wakeup(
            self._wake, queues=self.queues, using=self.using, listen=not self.burst
        )
        try:
            while not self._stopping.is_set():
                claimed: list[Job] = []
                capacity = self._claim_capacity()
                try:
                    upkeep_loop_connection(
                        self.using,
                        # A listening worker keeps its connection to claim at once (decision 84).
                        idle=idle and not waker.listens,
                        unused_for=time.monotonic() - self._loop_used_at,
                    )
                    self._maintain()
                    if self._in_flight and time.monotonic() >= next_renew:
                        self._renew_leases()
                        next_renew = time.monotonic() + renew_every
                    if capacity and not self._stopping.is_set():
                        claimed = self._claim(capacity)
                    failures = 0
                    self._loop_used_at = time.monotonic()
                except (DatabaseError, InterfaceError) as exc:
                    failures += 1
                    delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                    logger.error(
                        "database error in the worker loop (%s); reconnecting in %.1fs",
                        exc,
                        delay,
                        extra={"action": "db_error"},
                    )
                    connections[self.using].close()
                    self._wait(delay)
                    continue
                if claimed and self._stopping.is_set():
                    # Stopped during the claim (a signal while the claim statement ran):
                    # nothing of it starts; the loop ends and drains.
                    self._release(claimed)
                    claimed = []
                self._claimed_total += len(claimed)
                idle = not claimed and not self._in_flight
                for job in claimed:
                    with self._lock:
                        self._in_flight[job.pk] = job
                    self._work.put(job)
                if (
                    not claimed
                    and not self._in_flight
                    and (self.burst or self._claim_capacity() == 0)
                ):
                    return
                full = bool(claimed) and len(claimed) == capacity
                timeout = (
                    renew_every if (full or self.burst) else min(self.poll_interval, renew_every)
                )
                if capacity and not (full or self.burst):
                    # A free thread sleeps until the next deadline, at most a poll (decision 83).
                    timeout = wakeup.idle_timeout(timeout, queues=self.queues, using=self.using)
                self._wait(timeout)
        finally:
            waker.stop()
            self._drain(threads)

    def _wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a job finishes or on stop."""
        if self._wake.wait(timeout):
            self._wake.clear()  # one wake-up covers every job that ended meanwhile

    def _drain(self, threads: list[threading.Thread]) -> None:
        """Wait up to the grace period for running jobs, renewing their leases; stop the threads.

        After a second signal (``SystemExit`` on its way out of the loop) nothing is
        waited for: that signal means "exit now", wherever in the loop it landed.
        """
        deadline = time.monotonic() + self.shutdown_grace.total_seconds()
        next_renew = time.monotonic() + self.lease.total_seconds() / 3
        while self._in_flight and time.monotonic() < deadline and self._signals_seen < 2:
            if self._wake.wait(0.1):
                self._wake.clear()
            if self._in_flight and time.monotonic() >= next_renew:
                try:
                    self._renew_leases()
                except (DatabaseError, InterfaceError):
                    logger.exception("lease renewal failed during shutdown")
                    # A broken connection stays broken: close it so the next renewal reconnects
                    # (otherwise every renewal fails, the lease lapses and the job runs twice).
                    connections[self.using].close()
                next_renew = time.monotonic() + self.lease.total_seconds() / 3
        if self._in_flight:
            logger.warning(
                "%s with %d job(s) still running; their leases will lapse and "
                "another worker will run them again",
                "second signal" if self._signals_seen > 1 else "grace period over",
                len(self._in_flight),
                extra={"action": "shutdown_timeout"},
            )
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join(timeout=0.5)

    def _renew_leases(self) -> None:
        """Renew the leases of the jobs in flight (:func:`~django_debounce.leases.renew_leases`)."""
        with self._lock:
            ids = list(self._in_flight)
        if ids:
            leases.renew_leases(ids, worker_id=self.worker_id, lease=self.lease, using=self.using)

    def _thread_main(self) -> None:
        try:
            while True:
                job = self._work.get()
                if job is None:
                    return
                try:
                    close_old_connections()
                    close_dropped_connections()
                    if self._may_start(job):
                        self._process(job)
                except Exception:
                    logger.exception("worker thread failed while handling job %s", job.pk)
                finally:
                    close_old_connections()
                    with self._lock:
                        self._in_flight.pop(job.pk, None)
                    self._wake.set()
        finally:
            connections.close_all()

    # -- one job -------------------------------------------------------------------
    def _process(self, job: Job) -> None:
        with self._lock:
            self.processed += 1
        run_job(job, worker_id=self.worker_id, using=self.using, retry_for=self.lease)

    def _succeed(self, job: Job, result: object) -> None:
        """Record a successful run (:func:`~django_debounce.outcomes.record_success`)."""
        outcomes.record_success(
            job, result, worker_id=self.worker_id, using=self.using, retry_for=self.lease
        )
