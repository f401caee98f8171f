"""The lease keeper of an inline run: renew the running job's lease from one thread (§7).

A worker that runs its jobs in the calling thread (``--burst`` with one
thread) cannot renew a lease while a job runs, so a keeper thread does it.
One keeper serves the whole run, not a thread per job: starting and joining a
thread per job took about a third of a no-op job's time (bench/peers.py,
decision 66).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import TracebackType

from django.db import DatabaseError, InterfaceError, close_old_connections, connections

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


__all__ = ["InlineLeaseKeeper"]
