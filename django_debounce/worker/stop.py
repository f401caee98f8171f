"""How a worker stops: signals, the drain, and claimed jobs put back unstarted (contract §7).

:class:`WorkerStop` is the part of :class:`~django_debounce.worker.loop.Worker` that
ends a run: the first SIGTERM/SIGINT stops claiming, the second exits at once;
claimed jobs that never started (prefetched, or taken by a thread after the
stop) go back to READY as before their claim
(:func:`~django_debounce.run.leases.release_unstarted`); running jobs get the
grace period with their leases renewed; successes waiting for their batched
write are written first (:class:`~django_debounce.run.success_batches.SuccessBatch`,
decision 120). Kept apart from the loop so that each module stays readable.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import FrameType

from django.db import DatabaseError, InterfaceError, connections
from django.utils import timezone

from .. import tracing
from ..flow.start_rules import expired_at_start
from ..models import Job
from ..run import leases, outcomes
from ..run.interrupts import WorkerExit
from ..run.success_batches import SuccessBatch

logger = logging.getLogger("django_debounce.worker")


class WorkerStop:
    """Stopping, draining and putting back, for :class:`~django_debounce.worker.loop.Worker` (its base)."""

    worker_id: str
    using: str
    lease: timedelta
    shutdown_grace: timedelta
    _stopping: threading.Event
    _signals_seen: int
    _wake: threading.Event
    _work: queue_module.Queue[Job | None]
    _in_flight: dict[int, Job]
    _started_before: dict[int, datetime | None]
    _lock: threading.Lock
    _successes: SuccessBatch

    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self._signals_seen > 1:
            logger.warning("second signal %s: exiting now", signum, extra={"action": "abort"})
            raise WorkerExit(1)  # a SystemExit no task's error handling records
        logger.info(
            "signal %s: finishing running jobs (grace %ss), claiming no more",
            signum,
            self.shutdown_grace.total_seconds(),
            extra={"action": "shutdown"},
        )
        self.stop()

    def _may_start(self, job: Job) -> bool:
        """Return True if the claimed ``job`` starts now; once stopping, put it back (§7).

        Called where a claimed job is handed to :meth:`_process`: a stop that
        arrived while the job was being claimed, or before a thread took it,
        leaves it unstarted, so it goes back to READY at once
        (:meth:`_release`) instead of running into the grace period. A job that
        reaches its thread past its expiry (it waited, claimed ahead) ends
        EXPIRED unrun (:func:`~django_debounce.run.outcomes.expire_claimed`,
        decision 146).
        """
        if self._stopping.is_set():
            self._release([job])
            return False
        with self._lock:
            before = self._started_before.pop(job.pk, None)
        if job.expires_at is None:  # the common case costs no clock read
            return True
        now = timezone.now()
        if not expired_at_start(job, now):
            return True
        try:
            if outcomes.expire_claimed(
                job, started_before=before, worker_id=self.worker_id, now=now, using=self.using
            ):
                tracing.expired_unrun(job)
        except (DatabaseError, InterfaceError):
            logger.exception(
                "could not expire job %s; it stays claimed until its lease lapses",
                job.pk,
                extra={"action": "expire_error", "job_id": job.pk},
            )
        return False

    def _release(self, jobs: Sequence[Job]) -> None:
        """Put claimed, unstarted ``jobs`` back as before their claim (:func:`~django_debounce.run.leases.release_unstarted`).

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

    def _put_back(self, jobs: Sequence[Job]) -> None:
        """Put claimed, unstarted ``jobs`` back (:meth:`_release`) and stop holding them.

        The inline run calls it on a stop, and when something escapes a job's run (its
        outcome could not be written, the second signal): the jobs it had not started
        go back at once instead of waiting RUNNING for their lease (decision 150).
        """
        if jobs:
            self._release(jobs)
        with self._lock:
            for job in jobs:
                self._in_flight.pop(job.pk, None)

    def _drain(self, threads: list[threading.Thread]) -> None:
        """Stop: put back the jobs no thread started, wait for running ones, write every success.

        Successes finished so far are written first, then the prefetched jobs
        no thread took are put back unstarted in one write (§7). Running jobs
        get up to the grace period (their leases renewed, their successes
        flushed as they come), and the last successes are written at the end.
        After a second signal (``SystemExit`` on its way out of the loop) nothing is
        waited for: that signal means "exit now", wherever in the loop it landed.
        """
        unstarted: list[Job] = []
        while True:
            try:
                job = self._work.get_nowait()
            except queue_module.Empty:
                break
            if job is not None:
                unstarted.append(job)
        self._successes.flush_or_log()
        if unstarted:
            self._release(unstarted)
            with self._lock:
                for job in unstarted:
                    self._in_flight.pop(job.pk, None)
        deadline = time.monotonic() + self.shutdown_grace.total_seconds()
        next_renew = time.monotonic() + self.lease.total_seconds() / 3
        while self._in_flight and time.monotonic() < deadline and self._signals_seen < 2:
            if self._wake.wait(0.1):
                self._wake.clear()
            self._successes.flush_or_log()
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
        self._successes.flush_or_log()

    def _held_ids(self) -> list[int]:
        """Return the ids this worker holds RUNNING: claimed (started or not) and finished unwritten."""
        with self._lock:
            ids = list(self._in_flight)
        return ids + self._successes.pending_ids()

    def _renew_leases(self) -> None:
        """Renew the leases of the jobs in flight (:func:`~django_debounce.run.leases.renew_leases`)."""
        ids = self._held_ids()
        if ids:
            leases.renew_leases(ids, worker_id=self.worker_id, lease=self.lease, using=self.using)


__all__ = ["WorkerStop"]
