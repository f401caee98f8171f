"""Lease keepers: renew the leases of running jobs from one thread (§7).

A worker that runs its jobs in the calling thread (``--burst`` with one
thread) cannot renew a lease while a job runs, so a keeper thread does it
(:class:`InlineLeaseKeeper`). One keeper serves the whole run, not a thread per
job: starting and joining a thread per job took about a third of a no-op job's
time (bench/peers.py, decision 66). An executor that runs one job per call it
does not control (a Celery task) shares one :class:`ProcessLeaseKeeper` per
process (:data:`process_keeper`, decision 183).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType

from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from .leases import renew_leases

#: The worker's documented logger (docs/reference/commands.md): renewal errors keep its name.
logger = logging.getLogger("django_debounce.worker")


class InlineLeaseKeeper:
    """Call ``renew`` each time the job running inline has run a third of ``lease``.

    Use it as a context manager around the run (its thread, named
    ``debounce-lease``, has ended when the ``with`` block is left, however it
    is left), and :meth:`running` around each job. A job that finishes within
    a third of its lease is never renewed (its claim's lease is enough), so a
    run of short jobs costs no query here. ``renew`` renews whatever is in
    flight; a database error in it is logged, not raised, and the thread's
    connections are closed when it ends.
    """

    def __init__(self, renew: Callable[[], None], lease: timedelta) -> None:
        self._renew = renew
        self._interval = lease.total_seconds() / 3
        self._changed = threading.Condition()
        self._renew_due: float | None = None  # monotonic seconds; None while no job runs
        self._run_over = False
        self._thread = threading.Thread(target=self._main, name="debounce-lease", daemon=True)

    def __enter__(self) -> InlineLeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._changed:
            self._run_over = True
            self._changed.notify()
        self._thread.join()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Renew the lease while the ``with`` block (one job) runs."""
        with self._changed:
            self._renew_due = time.monotonic() + self._interval
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._renew_due = None

    def _main(self) -> None:
        try:
            while True:
                with self._changed:
                    while True:
                        if self._run_over:
                            return
                        now = time.monotonic()
                        due = self._renew_due
                        if due is not None and now >= due:
                            break
                        self._changed.wait(None if due is None else due - now)
                    self._renew_due = now + self._interval
                try:
                    self._renew()  # renews whatever is in flight: a job that just ended has left
                except (DatabaseError, InterfaceError):
                    logger.exception("lease renewal failed", extra={"action": "renew_error"})
                finally:
                    # Idle until the next renewal: CONN_MAX_AGE decides whether to keep it.
                    close_old_connections()
        finally:
            connections.close_all()


@dataclass
class _Held:
    """One run a :class:`ProcessLeaseKeeper` renews: its job, fence, lease and next renewal."""

    job_id: int
    worker_id: str
    lease: timedelta
    using: str
    due: float  # monotonic seconds


class ProcessLeaseKeeper:
    """One thread per process that renews the lease of every job the process is running.

    For an executor that gets one call per job (the Celery task
    ``django_debounce.run_job``): :meth:`holding` around each run registers it,
    and the one thread (``debounce-process-lease``, a daemon that lives as long
    as the process: started by the first run, started again in a forked child;
    not the inline keeper's ``debounce-lease``) renews each run whose lease reached a
    third of itself, every third of the lease, in one ``UPDATE`` per worker id
    (:func:`~django_debounce.run.leases.renew_leases`: fenced on RUNNING and
    the worker id, so a run that ended meanwhile is left alone). A run that
    ends within a third of its lease costs no query and no thread start: a
    lock, a dictionary entry, and a wake-up only when the thread was idle. A
    process that dies stops renewing, so its jobs' leases lapse and they run
    again (§7). A database error in a renewal is logged, not raised; the
    thread's connection is closed after each renewal as ``CONN_MAX_AGE`` says.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """Start empty, with no thread (also in a forked child: the parent's thread is not there)."""
        self._changed = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._thread: threading.Thread | None = None
        self._wake_at: float | None = None  # when the thread wakes; None while it is idle
        self.renewals = 0  # renewal statements run, for tests and metrics

    def held_ids(self) -> list[int]:
        """Return the ids of the jobs whose leases this keeper renews now."""
        with self._changed:
            return [held.job_id for held in self._held.values()]

    @contextmanager
    def holding(
        self, job_id: int, *, worker_id: str, lease: timedelta, using: str
    ) -> Iterator[None]:
        """Renew job ``job_id``'s lease (``lease``, under ``worker_id``) while the block runs."""
        token = self.hold(job_id, worker_id=worker_id, lease=lease, using=using)
        try:
            yield
        finally:
            self.release(token)

    def hold(self, job_id: int, *, worker_id: str, lease: timedelta, using: str) -> int:
        """Start renewing job ``job_id``'s lease until :meth:`release` gets the token returned.

        What :meth:`holding` does around a run; held apart from it by a success that
        waits for its batched write (still RUNNING: decision 215).
        """
        held = _Held(job_id, worker_id, lease, using, time.monotonic() + lease.total_seconds() / 3)
        token = id(held)
        with self._changed:
            self._held[token] = held
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="debounce-process-lease", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or held.due < self._wake_at:
                self._changed.notify()
        return token

    def release(self, token: int) -> None:
        """Stop renewing the run :meth:`hold` returned ``token`` for."""
        with self._changed:
            self._held.pop(token, None)

    def _due(self) -> list[_Held]:
        """Wait until some run's renewal is due; return those runs (their next renewal set)."""
        with self._changed:
            while True:
                now = time.monotonic()
                due = [held for held in self._held.values() if held.due <= now]
                if due:
                    for held in due:
                        held.due = now + held.lease.total_seconds() / 3
                    self._wake_at = now  # renewing: a new run need not wake the thread
                    return due
                self._wake_at = min((held.due for held in self._held.values()), default=None)
                self._changed.wait(None if self._wake_at is None else self._wake_at - now)

    def _main(self) -> None:
        while True:
            groups: dict[tuple[str, str, timedelta], list[int]] = {}
            for held in self._due():
                groups.setdefault((held.worker_id, held.using, held.lease), []).append(held.job_id)
            try:
                for (worker_id, using, lease), ids in groups.items():
                    renew_leases(ids, worker_id=worker_id, lease=lease, using=using)
                    self.renewals += 1
            except (DatabaseError, InterfaceError):
                logger.exception("lease renewal failed", extra={"action": "renew_error"})
            finally:
                close_old_connections()  # idle until the next renewal: CONN_MAX_AGE decides


#: This process's keeper for runs of an executor called once per job (the Celery executor).
process_keeper = ProcessLeaseKeeper()


__all__ = ["InlineLeaseKeeper", "ProcessLeaseKeeper", "process_keeper"]
