"""Successes of a Celery worker process's runs, written in batches by one thread (decisions 215-216).

A handed-off no-op job cost a Celery worker two round trips: the take and the
outcome, the outcome's durable commit the larger (bench/celery_drain.py, issue
#23). :data:`process_successes` keeps the plain successes of this process's runs
(:class:`~django_debounce.run.success_batches.SuccessBatch`, the built-in
worker's, each entry fenced on its own run's worker id) and one thread per
process (``debounce-celery-successes``, a daemon started by the first success,
started again in a forked child) writes them in one ``UPDATE`` once the oldest
has waited ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL`` seconds (0.1) or the batch is
full, on a connection of its own that it keeps
(``contrib.celery.kept_connection``, decision 184). The
Celery task returns as soon as its success is kept, so the task's worker thread
goes to the next message without waiting for the write.

What a success waiting here means (the built-in worker's rules, decision 120):
the job is still RUNNING under its lease, so the next job of its key, its
dependents and its concurrency cap's next job wait until the write (at most the
interval while the database answers); a failure, a retry, a dead letter, a
cancel and a success of a task with a circuit breaker are written at once.
A worker process killed (SIGKILL, OOM) before the write loses the kept
successes: each job's lease lapses and it runs again (at least once, §7). A warm
shutdown writes them first (Celery's ``worker_process_shutdown`` and
``worker_shutdown`` signals, and ``atexit``).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from django.db import connections

from ...conf import settings
from ...models import Job
from ...run.lease_keeper import process_keeper
from ...run.outcomes import record_success
from ...run.success_batches import SuccessBatch
from .kept_connection import close_kept, kept_connection

logger = logging.getLogger("django_debounce.celery")

#: Seconds the writer waits after a failed write before it tries again.
RETRY_PAUSE = 1.0


class _Batch(SuccessBatch):
    """A :class:`SuccessBatch` that wakes its process's writer thread when it needs a write."""

    def __init__(self, owner: ProcessSuccesses, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner = owner
        self._holds: dict[int, int] = {}  # job id: its lease keeper token

    def release_written(self) -> None:
        """Stop renewing the leases of the jobs no longer waiting (written, or found late)."""
        waiting = set(self.pending_ids())
        with self._lock:
            done = [pk for pk in self._holds if pk not in waiting]
            tokens = [self._holds.pop(pk) for pk in done]
        for token in tokens:
            process_keeper.release(token)

    def add(self, job: Job, stored: Any, result: object, *, worker_id: str = "") -> None:
        if job.pk in self.pending_ids():
            # An earlier run of this job still waits (its write failed past its lease, and the
            # job was handed off again): one statement sets a row once, so write this run now.
            record_success(
                job, result, worker_id=worker_id, using=self.using, retry_for=self.retry_for
            )
            return
        # Renewed until written: a live worker's waiting success keeps its job (decision 216).
        token = process_keeper.hold(
            job.pk, worker_id=worker_id, lease=self.retry_for, using=self.using
        )
        with self._lock:
            self._holds[job.pk] = token
        super().add(job, stored, result, worker_id=worker_id)
        due = self.seconds_until_due()
        if len(self) == 1 or due == 0:  # the writer sleeps until a batch has its first entry
            self._owner.wake()

    def holds(self, job: Job) -> Any:
        """Return ``(True, stored result)`` while ``job``'s success waits here, else ``(False, None)``."""
        with self._lock:
            for entry in reversed(self._entries):
                if entry.job is job:
                    return True, entry.stored
        return False, None


class ProcessSuccesses:
    """This process's successes waiting for their batched write, and the thread that writes them."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.flush_all)

    def _reset(self) -> None:
        """Start empty, with no thread (a forked child: the parent's entries and thread are not its)."""
        self._changed = threading.Condition()
        self._batches: dict[str, _Batch] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    def batch_for(self, using: str) -> SuccessBatch | None:
        """Return the batch a run on ``using`` keeps its success in, or ``None``: write it at once.

        ``None`` when ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL`` is 0 or the thread is
        inside a transaction (a test calling the task inside ``TestCase``).
        """
        interval, lease = settings.success_flush_interval, settings.lease
        if interval <= 0 or connections[using].in_atomic_block:
            return None
        with self._changed:
            batch = self._batches.get(using)
            if batch is None or (batch.interval, batch.retry_for) != (interval, lease):
                if batch is not None:  # a setting changed (a test): write the old ones first
                    self._write(batch)
                batch = self._batches[using] = _Batch(
                    self,
                    worker_id="celery:",
                    using=using,
                    interval=interval,
                    retry_for=lease,
                )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="debounce-celery-successes", daemon=True
                )
                self._thread.start()
        return batch

    def holds(self, job: Job, using: str) -> tuple[bool, Any]:
        """Return ``(True, stored result)`` while ``job``'s success waits for its write, else ``(False, None)``."""
        batch = self._batches.get(using)
        return (False, None) if batch is None else batch.holds(job)

    def pending_ids(self) -> list[int]:
        """Return the ids of the jobs whose successes wait for their write."""
        return [pk for batch in list(self._batches.values()) for pk in batch.pending_ids()]

    def wake(self) -> None:
        """Wake the writer thread: a batch got its first entry or is full."""
        with self._changed:
            self._changed.notify()

    def flush_all(self, *args: object, **kwargs: object) -> None:
        """Write every waiting success now (a Celery shutdown signal's receiver; errors are logged)."""
        for batch in list(self._batches.values()):
            self._write(batch)

    def stop(self, timeout: float = 10.0) -> None:
        """Write every waiting success, then end the writer thread and close its connections.

        The next success starts a new thread. For a test's teardown (its
        database is dropped next) and a stopping process; ``timeout``: seconds
        to wait for the thread.
        """
        with self._changed:
            thread, self._stopping = self._thread, True
            self._changed.notify()
        if thread is not None:
            thread.join(timeout)
        self.flush_all()
        close_kept()
        with self._changed:
            self._thread, self._stopping = None, False

    def _write(self, batch: _Batch) -> bool:
        """Write ``batch`` on this thread's kept connection; return False if the database failed."""
        with kept_connection(batch.using):
            before = len(batch)
            batch.flush_or_log()
            batch.release_written()
            return not (before and len(batch) == before)

    def _main(self) -> None:
        try:
            self._loop()
        finally:
            self.flush_all()
            close_kept()
            connections.close_all()

    def _loop(self) -> None:
        pause = 0.0
        while True:
            with self._changed:
                while True:
                    if self._stopping:
                        return
                    waits = [
                        due
                        for due in (b.seconds_until_due() for b in self._batches.values())
                        if due is not None
                    ]
                    wait = max(min(waits), pause) if waits else None
                    if wait is not None and wait <= 0:
                        break
                    self._changed.wait(wait)
                    pause = 0.0
                batches = list(self._batches.values())
            failed = False
            for batch in batches:
                if batch.seconds_until_due() == 0:
                    failed = not self._write(batch) or failed
            pause = RETRY_PAUSE if failed else 0.0


#: This Celery worker process's successes waiting for their batched write.
process_successes = ProcessSuccesses()


__all__ = ["RETRY_PAUSE", "ProcessSuccesses", "process_successes"]
