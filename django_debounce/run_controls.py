"""What a running job may be told while it runs (a cancel request, its time limits) and may tell (its progress).

A :class:`RunControl` is made for each run (by
:func:`django_debounce.run.execution.run_job`, on every executor) and reached
by the task through its :class:`~django_debounce.context.JobContext`
(``cancel_requested``, ``time_left``, ``checkpoint()``). A cancel request is a
durable mark on the job's row (``Job.cancel_requested_at``, written by
``Job.cancel()``); the control reads it at most once per
``DEBOUNCE_CANCEL_POLL_INTERVAL``, so a task may ask in a tight loop. Time is
measured on the monotonic clock from the run's start.

Importing this module does not import models (the read imports them when it runs).
"""

from __future__ import annotations

import threading
import time

from .exceptions import JobCancelled, JobTimeout
from .progress import ProgressReporter


class RunControl:
    """The cancel mark and the deadlines of one run of job ``job_id``.

    Args:
        job_id: the running job's primary key (``None``: an inline call, never cancelled).
        using: the database alias its row is read from.
        timeout: the soft limit, seconds from now (``None``: none).
        grace: seconds past ``timeout`` until the hard limit (``None``: no hard limit).
        poll_interval: the longest a read of the cancel mark is trusted, seconds.
        progress: where the run's ``set_progress`` calls go (default: one that writes nothing,
            as for an inline call; :func:`~django_debounce.run.limited_calls.control_for`
            gives a claimed job's run one fenced on its attempt, decision 202).
    """

    def __init__(
        self,
        job_id: int | None,
        *,
        using: str = "default",
        timeout: float | None = None,
        grace: float | None = None,
        poll_interval: float = 1.0,
        progress: ProgressReporter | None = None,
    ) -> None:
        self.job_id = job_id
        self.progress = progress or ProgressReporter(None, using=using)
        self.using = using
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = None if timeout is None else self.started + timeout
        self.hard_deadline = (
            None if self.deadline is None or grace is None else self.deadline + grace
        )
        self.poll_interval = poll_interval
        self._cancelled = False
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def note_cancel_requested(self) -> None:
        """Record that the job's cancel was requested (learned elsewhere: no read needed)."""
        self._cancelled = True

    @property
    def cancel_known(self) -> bool:
        """True once a cancel was seen (no read: safe in an event loop)."""
        return self._cancelled

    @property
    def cancel_requested(self) -> bool:
        """True once a cancel of the job was requested: the row read at most once per poll interval."""
        if self._cancelled or self.job_id is None:
            return self._cancelled
        now = time.monotonic()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.poll_interval:
                return self._cancelled
            self._read_at = now
        return self.read_cancel()

    def read_cancel(self) -> bool:
        """Read the job's cancel mark now (one query) and return it.

        Raises:
            DatabaseError: the read failed.
        """
        if self._cancelled or self.job_id is None:
            return self._cancelled
        from .models import Job  # noqa: PLC0415 (lazy: importable before the app registry)

        if (
            Job.objects.using(self.using)
            .filter(pk=self.job_id, cancel_requested_at__isnull=False)
            .exists()
        ):
            self._cancelled = True
        return self._cancelled

    def time_left(self) -> float | None:
        """Seconds until the soft limit (negative once past it), or ``None`` without a timeout."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def timed_out(self) -> bool:
        """True once the soft limit has passed."""
        left = self.time_left()
        return left is not None and left <= 0

    def checkpoint(self) -> None:
        """Raise if the run should stop now; otherwise return at once.

        Raises:
            JobCancelled: a cancel of the job was requested (decision 186).
            JobTimeout: the run passed its ``timeout`` (decision 187).
        """
        if self.cancel_requested:
            raise JobCancelled(f"job {self.job_id} was cancelled while it ran (a cancel request)")
        if self.timed_out():
            raise JobTimeout(self.timeout_message())

    def timeout_message(self, *, hard: bool = False) -> str:
        """The error text of a run that passed its limit (``hard``: the hard one)."""
        if hard:
            return (
                f"job {self.job_id} ran past its timeout of {self.timeout:g}s and its grace "
                "(DEBOUNCE_TIMEOUT_GRACE) without reaching a checkpoint; its thread was retired"
            )
        return f"job {self.job_id} ran past its timeout of {self.timeout:g}s"


__all__ = ["RunControl"]
