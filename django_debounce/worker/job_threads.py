"""The worker's job threads, and the hard time limit that retires a stuck one (decision 187).

:class:`JobThreads` is the part of :class:`~django_debounce.worker.loop.Worker`
that runs jobs in threads: each thread takes claimed jobs from the work
queue and runs them (:func:`~django_debounce.run.execution.run_job`). A job
with a ``timeout`` has a soft limit its task observes (``context.time_left``,
``context.checkpoint()``) and, for a sync task, a hard limit ``timeout +
DEBOUNCE_TIMEOUT_GRACE``. Python cannot stop a thread, so past the hard limit
the loop gives up on it: the run is recorded failed with
:class:`~django_debounce.exceptions.JobTimeout` (retried or dead-lettered by
the task's policy; its lease, window and lock released, so later jobs of its
key can run), the thread is retired (it exits once its task returns; what the
task returns then is discarded, every outcome write being fenced on the run,
§11) and a fresh thread takes its place. Once more than
``DEBOUNCE_MAX_STUCK_THREADS`` retired threads are still running the worker
stops claiming, drains and :meth:`~django_debounce.worker.loop.Worker.run`
leaves :attr:`JobThreads.exit_code` at :data:`EXIT_STUCK` (75, ``EX_TEMPFAIL``):
``run_debounce_worker`` exits with it, for its supervisor to restart it.

The inline mode (``--burst`` with one thread) runs jobs in the calling thread,
which cannot be replaced: there only the soft limit applies.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from .. import registry
from ..conf import settings
from ..exceptions import JobTimeout
from ..models import Job
from ..run import outcomes
from ..run.execution import run_job
from ..run_controls import RunControl
from .connections import close_dropped_connections
from .stop import WorkerStop

logger = logging.getLogger("django_debounce.worker")

#: The exit status of a worker that stopped because too many of its threads are stuck
#: (``EX_TEMPFAIL`` of sysexits.h: a supervisor restarts it).
EXIT_STUCK = 75


class _Run:
    """A job a thread runs under a hard limit."""

    __slots__ = ("control", "job", "thread")

    def __init__(self, job: Job, control: RunControl, thread: threading.Thread) -> None:
        self.job, self.control, self.thread = job, control, thread


class JobThreads(WorkerStop):
    """Job threads and hard limits, for :class:`~django_debounce.worker.loop.Worker` (its base)."""

    concurrency: int
    processed: int
    _job_seconds: float | None

    #: The worker's exit status: 0, or :data:`EXIT_STUCK` after too many stuck threads.
    exit_code = 0

    def _start_threads(self) -> list[threading.Thread]:
        """Start ``concurrency`` job threads; return the list the drain joins (kept current)."""
        self._threads: list[threading.Thread] = []
        self._hard_runs: dict[threading.Thread, _Run] = {}
        self._stuck: list[threading.Thread] = []
        self._overdue: list[_Run] = []  # retired runs whose failure is not written yet
        for _ in range(self.concurrency):
            self._add_thread()
        return self._threads

    def _add_thread(self) -> None:
        thread = threading.Thread(
            target=self._thread_main, name=f"debounce-job-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _thread_main(self) -> None:
        me = threading.current_thread()
        try:
            # A retired thread takes no more jobs. (No _stuck yet: a worker whose threads were
            # never started, whose job-thread loop a test drives.)
            while me not in getattr(self, "_stuck", ()):
                job = self._work.get()
                if job is None:
                    return
                try:
                    close_old_connections()
                    close_dropped_connections()
                    if self._may_start(job):
                        self._process(job)
                except BaseException:  # the thread outlives any job (decision 150)
                    logger.exception("worker thread failed while handling job %s", job.pk)
                finally:
                    close_old_connections()
                    with self._lock:
                        if self._in_flight.get(job.pk) is job:  # not a later claim of it
                            del self._in_flight[job.pk]
                    self._wake.set()
        finally:
            connections.close_all()

    def _process(self, job: Job) -> None:
        with self._lock:
            self.processed += 1
        began = time.monotonic()
        me = threading.current_thread()
        threaded = me in getattr(self, "_threads", ())

        def watch(control: RunControl) -> None:
            if threaded and control.hard_deadline is not None:
                with self._lock:
                    self._hard_runs[me] = _Run(job, control, me)
                self._wake.set()  # the loop's wait now ends at this hard limit

        try:
            run_job(
                job,
                worker_id=self.worker_id,
                using=self.using,
                retry_for=self.lease,
                successes=self._successes if self._successes.interval > 0 else None,
                on_control=watch,
            )
        finally:
            if threaded:
                with self._lock:
                    self._hard_runs.pop(me, None)
            took = time.monotonic() - began
            with self._lock:
                last = self._job_seconds
                self._job_seconds = took if last is None else 0.9 * last + 0.1 * took

    def _wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds (less until a hard limit), waking early when a job ends or on stop."""
        deadlines = [run.control.hard_deadline for run in self._runs_now()]
        if deadlines:
            timeout = max(
                0.0, min(timeout, min(d for d in deadlines if d is not None) - time.monotonic())
            )
        if self._wake.wait(timeout):
            self._wake.clear()  # one wake-up covers every job that ended meanwhile
        self._retire_overdue()

    def _runs_now(self) -> list[_Run]:
        with self._lock:
            return list(getattr(self, "_hard_runs", {}).values())

    def _retire_overdue(self) -> None:
        """Retire each thread whose run passed its hard limit (a fresh one replaces it), record the run failed."""
        now = time.monotonic()
        retired: list[_Run] = []
        with self._lock:
            for thread, run in list(getattr(self, "_hard_runs", {}).items()):
                deadline = run.control.hard_deadline
                if deadline is not None and now >= deadline:
                    del self._hard_runs[thread]
                    self._threads.remove(thread)
                    self._stuck.append(thread)  # it takes no more work once its task returns
                    retired.append(run)
            self._stuck[:] = [thread for thread in self._stuck if thread.is_alive()]
            stuck = len(self._stuck)
        for run in retired:
            self._add_thread()
            self._overdue.append(run)
            logger.error(
                "job %s (%s) ran past its hard time limit; thread %s retired (%d stuck), a "
                "fresh thread replaces it",
                run.job.pk,
                run.job.task_name,
                run.thread.name,
                stuck,
                extra={"action": "hard_timeout", "job_id": run.job.pk},
            )
        for run in list(getattr(self, "_overdue", ())):
            if self._record_timeout(run):
                self._overdue.remove(run)
        if retired and stuck > settings.max_stuck_threads:
            logger.error(
                "worker %s has %d stuck threads (DEBOUNCE_MAX_STUCK_THREADS=%d): stopping to "
                "be restarted (exit status %d)",
                self.worker_id,
                stuck,
                settings.max_stuck_threads,
                EXIT_STUCK,
                extra={"action": "stuck_exit"},
            )
            self.exit_code = EXIT_STUCK
            self.stop()

    def _record_timeout(self, run: _Run) -> bool:
        """Record ``run`` failed with its hard timeout (fenced: a run that ended meanwhile keeps its end).

        Returns False when the database refused for now (the job stays held and
        renewed; the next wait tries again).
        """
        job = run.job
        task = registry.lookup(job.task_name)
        try:
            outcomes.record_failure(
                job,
                JobTimeout(run.control.timeout_message(hard=True)),
                worker_id=self.worker_id,
                using=self.using,
                min_backoff=task.options.min_backoff if task else None,
                max_backoff=task.options.max_backoff if task else None,
                retry_for=self.lease,
            )
        except (DatabaseError, InterfaceError):
            logger.exception("could not record the hard timeout of job %s", job.pk)
            return False
        with self._lock:
            if self._in_flight.get(job.pk) is job:  # no more renewals: its lease is gone
                del self._in_flight[job.pk]
        return True


__all__ = ["EXIT_STUCK", "JobThreads"]
