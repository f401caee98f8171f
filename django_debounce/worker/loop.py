"""The worker: the loop that claims due jobs, runs them and records the outcome (contract §7, §11).

:class:`Worker` takes keyword-only options (``run_debounce_worker`` maps its flags
onto them). This module is the loop alone: claims (with a prefetch once the queue is
busy, decision 121), threads, lease keeping and periodic ticks
(:mod:`django_debounce.ops.periodic`); signals, shutdown and putting jobs back are
:mod:`django_debounce.worker.stop`. Each job runs through
:func:`django_debounce.run.execution.run_job` (a failure recorded at once, a success
batched by :class:`~django_debounce.run.success_batches.SuccessBatch`, decision 120;
every write fenced on the run, §11), outside any transaction."""

from __future__ import annotations

import logging
import os
import queue as queue_module
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    connections,
    router,
)
from django.utils import timezone

from ..claim.claiming import claim_batch
from ..conf import settings
from ..db_errors import ReconnectBackoff
from ..models import Job
from ..ops.periodic import PeriodicScheduler
from ..ops.sweep import SweepSchedule
from ..run import leases
from ..run.lease_keeper import InlineLeaseKeeper
from ..run.success_batches import SuccessBatch
from . import wakeup
from .connections import upkeep_loop_connection
from .job_threads import JobThreads

logger = logging.getLogger("django_debounce.worker")

#: Claims a worker makes in a row when each loses to lock contention (``claim_batch``'s
#: ``attempts``): contention is not a database outage.
CLAIM_ATTEMPTS = 5

Status = Job.Status

#: A busy worker claims ahead at most the jobs its threads run in about this many seconds
#: (by their average run time so far), and never more than ``prefetch`` (decision 121).
PREFETCH_HORIZON = 0.2


class Worker(JobThreads):
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
        prefetch: jobs claimed beyond the free threads once a claim came back
            full (``DEBOUNCE_PREFETCH``); they wait RUNNING under a renewed
            lease and are put back unstarted on a stop (decision 121).
        success_flush_interval: longest a success waits for its batched write,
            in seconds (``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``; 0: write at once;
            :class:`~django_debounce.run.success_batches.SuccessBatch`, decision 120).
        shutdown_grace: how long a stop waits for running jobs (``DEBOUNCE_SHUTDOWN_GRACE``).
        worker_id: identity recorded on claimed jobs (default host:pid:random).
        handle_signals: install SIGTERM/SIGINT handlers (main thread only).
        using: database alias.
        periodic: defer the due ticks of periodic tasks on each poll (``--no-periodic``: off).
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
        prefetch: int | None = None,
        success_flush_interval: float | None = None,
        periodic: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency} must be at least 1")
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs={max_jobs} must be at least 1")
        self.prefetch = settings.prefetch if prefetch is None else prefetch
        if self.prefetch < 0:
            raise ValueError(f"prefetch={self.prefetch} must be at least 0")
        flush_every = (
            settings.success_flush_interval
            if success_flush_interval is None
            else success_flush_interval
        )
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
        # Empty while flush_every is 0: run_job then writes each success at once.
        self._successes = SuccessBatch(
            worker_id=self.worker_id, using=self.using, interval=flush_every, retry_for=self.lease
        )
        self.processed = 0
        self._claimed_total = 0
        self._next_maintenance = 0.0
        self._sweep_schedule = SweepSchedule()
        self._periodic = PeriodicScheduler(scheduler_id=self.worker_id, enabled=periodic)
        self._idle = True
        self._job_seconds: float | None = None  # moving average of a job's run time
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
        self._claimed_at: datetime | None = None  # when the last claim began (package clock)

    # -- control (stop, signals, the drain and putting jobs back: WorkerStop) ------
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
        """Return how many jobs to claim now, capped by ``max_jobs`` (decision 121).

        Free threads only while the queue looks idle (the last claim came back
        short): a worker waking up takes no more than it can start. Once a
        claim came back full it also prefetches ``prefetch`` jobs, and claims
        again only when fewer than half of them are left, so one claim
        statement serves many jobs.
        """
        held = len(self._in_flight)
        ahead = 0 if self._idle else self._ahead()
        if not ahead:
            want = self.concurrency - held
        elif held > self.concurrency + ahead // 2:
            want = 0
        else:
            want = self.concurrency + ahead - held
        if self.max_jobs is None:
            return max(0, want)
        return max(0, min(want, self.max_jobs - self._claimed_total))

    def _ahead(self) -> int:
        """Return how many jobs to claim ahead: what the threads run in ``PREFETCH_HORIZON``.

        At most ``prefetch``; none before a job of this worker has finished (its
        run time unknown): a worker of long jobs never hoards jobs that idle
        workers could start.
        """
        seconds = self._job_seconds
        if seconds is None or not self.prefetch:
            return 0
        return min(self.prefetch, int(self.concurrency * PREFETCH_HORIZON / max(seconds, 1e-6)))

    def _maintain(self) -> None:
        """Defer due periodic ticks; reclaim lapsed leases (at start, then at most once a poll)."""
        self._periodic.defer_due()
        if time.monotonic() < self._next_maintenance:
            return
        leases.reclaim_expired_leases(using=self.using, exclude_ids=self._held_ids())
        self._next_maintenance = time.monotonic() + min(self.poll_interval, 1.0)
        self._sweep()

    def _sweep(self) -> None:
        """Run the dead-letter auto-retry sweep when due (:class:`~django_debounce.ops.sweep.SweepSchedule`)."""
        self._sweep_schedule.run_if_due(
            using=self.using, lease=self.lease, stopping=self._stopping, renew=self._renew_leases
        )

    def _claim(self, limit: int) -> list[Job]:
        """Claim up to ``limit`` jobs, claiming again after lock contention (``CLAIM_ATTEMPTS``)."""
        self._claimed_at = timezone.now()  # what this claim saw of the buckets (decision 170)
        claim = claim_batch(
            worker_id=self.worker_id,
            limit=limit,
            lease=self.lease,
            queues=self.queues,
            using=self.using,
            peek=self._idle,
            attempts=CLAIM_ATTEMPTS,
            # Free threads start these at once; the rest wait (decision 146).
            start_now=max(0, self.concurrency - len(self._in_flight)),
        )
        with self._lock:
            self._started_before.update(claim.started_before)
        # After a short batch the queue is probably drained: peek before locking next time.
        self._idle = len(claim.jobs) < limit
        return claim.jobs

    def _run_inline(self) -> None:
        """Claim (with prefetch) and run the jobs in this thread; a keeper thread renews leases."""
        with InlineLeaseKeeper(self._renew_leases, self.lease) as keeper:
            try:
                self._maintain()
                while not self._stopping.is_set() and (limit := self._claim_capacity()) > 0:
                    jobs = self._claim(limit)
                    if not jobs:
                        if self._successes.flush_pending():
                            continue
                        return
                    self._claimed_total += len(jobs)
                    with self._lock:
                        self._in_flight.update((job.pk, job) for job in jobs)
                    with keeper.running():  # from the claim on: prefetched jobs are renewed too
                        self._run_claimed(jobs)
            finally:
                self._successes.flush_or_log()

    def _run_claimed(self, jobs: list[Job]) -> None:
        """Run the claimed ``jobs`` in turn; on a stop (flushed first) or an escape, put the rest back."""
        for index, job in enumerate(jobs):
            if self._stopping.is_set():
                self._successes.flush_or_log()
                return self._put_back(jobs[index:])
            try:
                if self._may_start(job):
                    self._process(job)
            except BaseException:
                self._put_back(jobs[index + 1 :])
                raise
            finally:
                with self._lock:
                    self._in_flight.pop(job.pk, None)
            self._successes.flush_if_due()

    def _run_threaded(self) -> None:
        threads = self._start_threads()  # job threads, replaced past a hard limit (decision 187)
        renew_every = self.lease.total_seconds() / 3
        next_renew = time.monotonic() + renew_every
        outage = ReconnectBackoff("the worker loop", logger=logger, using=self.using)
        idle = True  # the last poll claimed nothing and no job was running
        # Wakes the loop when a job is enqueued (LISTEN/NOTIFY or Redis; decision 80).
        waker = wakeup.start_wakeup(
            self._wake, queues=self.queues, using=self.using, listen=not self.burst
        )
        try:
            while not self._stopping.is_set():
                claimed: list[Job] = []
                unblocked = False
                capacity = self._claim_capacity()
                try:
                    upkeep_loop_connection(
                        self.using,
                        idle=idle,
                        unused_for=time.monotonic() - self._loop_used_at,
                        # A listening worker keeps its connection to claim at once (decision 84).
                        keep=waker.listens,
                    )
                    self._maintain()
                    if self._held_ids() and time.monotonic() >= next_renew:
                        self._renew_leases()
                        next_renew = time.monotonic() + renew_every
                    self._successes.flush_if_due()
                    if capacity and not self._stopping.is_set():
                        claimed = self._claim(capacity)
                        # A short claim: successes not written yet may hold back jobs (the next
                        # of a key, a dependent); write them and claim again at once.
                        unblocked = len(claimed) < capacity and self._successes.flush_pending()
                    outage.succeeded()
                    self._loop_used_at = time.monotonic()
                except (DatabaseError, InterfaceError) as exc:
                    self._wait(outage.failed(exc))
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
                if unblocked:
                    continue
                # A burst ends on a claim that found nothing, not on one skipped because
                # enough jobs were held when this round began (they may all have ended since).
                if (
                    not claimed
                    and not self._in_flight
                    and ((self.burst and capacity) or self._claim_capacity() == 0)
                ):
                    return
                full = bool(claimed) and len(claimed) == capacity
                timeout = (
                    renew_every if (full or self.burst) else min(self.poll_interval, renew_every)
                )
                if capacity and not (full or self.burst):
                    # A free thread sleeps until the next deadline or bucket refill, at most a poll
                    # (decisions 83, 167).
                    timeout = wakeup.idle_timeout(
                        timeout,
                        queues=self.queues,
                        using=self.using,
                        free=max(1, self.concurrency - len(self._in_flight)),
                        since=self._claimed_at,
                    )
                self._wait(self._successes.cap_wait(self._periodic.cap_wait(timeout)))
        finally:
            waker.stop()
            self._drain(threads)
