"""What a task declared with ``takes_context=True`` receives first: :class:`JobContext`.

Modelled on Django's own tasks framework (``django.tasks.TaskContext``, passed
first to a task declared with ``@task(takes_context=True)``; it carries
``task_result`` and ``attempt``). This package's unit of work is the
:class:`~django_debounce.models.Job` row, so the context carries the job
instead of a task result, keeps Django's ``attempt``, and adds what only a
debounced job knows: how many calls its window collapsed, and why it ran when
it did.

Importing this module does not import models (``Job`` is a type-only import),
so ``from django_debounce import JobContext`` is safe in settings and in
``tasks.py`` modules loaded before the app registry is ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from asgiref.sync import sync_to_async

from .exceptions import ProgressError
from .progress import validate_progress
from .run_controls import RunControl

if TYPE_CHECKING:
    from .models import Job


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


RunReason = Literal["quiet", "max_wait", "not_debounced", "retry", "inline"]
"""Why a run started; see :attr:`django_debounce.JobContext.run_reason`."""


@dataclass(frozen=True)
class JobContext:
    """The run a task declared with ``takes_context=True`` is part of (passed as its first argument).

    Attributes:
        job: the :class:`~django_debounce.models.Job` being run, as the worker
            claimed it (status ``RUNNING``, ``attempts`` already counting this
            run, ``lease_expires_at`` set). ``None`` when the task is called
            inline (no job). It is the worker's own instance, which the
            worker updates with the outcome after the run: read what you need
            while the task runs, and never save it (the worker records the
            outcome itself, fenced on the attempt, §11).
        attempt: 1 for the first run, 2 for the first retry, and so on; the
            job's ``attempts`` counter, which also counts a run whose worker
            died (§11). Same name and meaning as Django's
            ``TaskContext.attempt``. 1 when called inline.
        calls_collapsed: how many calls joined the job's open window after
            the one that opened it (``Job.enqueue_count - 1``: 0 for a job
            enqueued once, N - 1 after a burst of N calls, §4.2), the one
            meaning of "calls collapsed" in the package (the admin column, the
            ``django_debounce_debounced_total`` metric, decision 161). A
            coalesced call (§6) is not counted: it returns the job without
            touching it. 0 when called inline; ``job.enqueue_count`` is every
            call the run serves.
        run_reason: why this run started when it did:

            * ``"quiet"``: the debounce window went quiet (no call for a
              whole window, §4.2);
            * ``"max_wait"``: the window reached its ceiling
              (``opened_at + debounce_max_wait``) while calls kept coming;
            * ``"not_debounced"``: a job without a window (plain, coalesced,
              or a call whose key callable returned ``None``), due at its
              ``run_at``;
            * ``"retry"``: any attempt after the first (a retry after an
              exception's backoff, or a rerun after a worker died); the
              window's own reason is not recorded across attempts, and
              after a backoff ``run_at`` no longer tells it;
            * ``"inline"``: the task was called directly, with no job.

            On a first attempt it equals ``Job.run_reason``.
        control: the run's cancel mark, time limits and progress
            (:class:`~django_debounce.run_controls.RunControl`), read through
            :attr:`cancel_requested`, :attr:`time_left` and :meth:`checkpoint`,
            written through :meth:`set_progress`.
    """

    job: Job | None
    attempt: int
    calls_collapsed: int
    run_reason: RunReason
    control: RunControl = field(default_factory=lambda: RunControl(None), repr=False, compare=False)

    @property
    def cancel_requested(self) -> bool:
        """True once ``Job.cancel()`` asked this running job to stop (decision 186).

        Reads the job's row at most once per ``DEBOUNCE_CANCEL_POLL_INTERVAL``
        (1 s by default), so ask as often as you like. A task that never asks
        runs to its end and ends as it would have. Always False inline.

        Raises:
            DatabaseError: the read failed.
        """
        return self.control.cancel_requested

    @property
    def time_left(self) -> float | None:
        """Seconds left before the run's ``timeout`` (negative past it); ``None`` without one (decision 187)."""
        return self.control.time_left()

    def checkpoint(self) -> None:
        """Return at once, or raise when the run should stop; call it between steps of long work.

        Raises:
            JobCancelled: a cancel was requested (the job ends CANCELLED if the
                task lets it propagate; docs/howto/cancel-running-jobs.md).
            JobTimeout: the run passed its ``timeout`` (a failure, retried or
                dead-lettered by the task's policy; docs/howto/time-limits.md).
            DatabaseError: reading the cancel mark failed.
        """
        self.control.checkpoint()

    def set_progress(self, done: int, total: int | None = None, note: str = "") -> None:
        """Report how far the run has got: ``done`` units of ``total``, with a ``note`` (decision 202).

        Call it as often as you like: the job's row is written at most once per
        second per run (``django_debounce.progress.MIN_INTERVAL``; the first call at
        once, a later one held back and written by the next call after the second,
        or when the run ends, decision 203). The values appear in the admin (a bar),
        ``debounce_status``, a Django task's ``TaskResult.metadata["progress"]`` and
        Celery's ``PROGRESS`` state (docs/howto/progress.md). A run that lost its
        lease writes nothing (fenced like the outcome, §11). Inline: validated only.

        Args:
            done: units done, an ``int >= 0`` (a ``bool`` is refused).
            total: units in all, an ``int >= done``; ``None`` when unknown (no bar, a count).
            note: free text, at most 200 characters (``""``: none).

        Raises:
            ProgressError: a value of the wrong type or range (named in the
                message), or a call from a running event loop (an async task:
                ``await context.aset_progress(...)``); nothing was written.
        """
        progress = validate_progress(done, total, note)
        if self.job is not None and _in_event_loop():
            raise ProgressError(
                "set_progress was called from an async task's event loop, where it cannot "
                "write the job's row; use: await context.aset_progress(done, total, note)"
            )
        self.control.progress.set(progress)

    async def aset_progress(self, done: int, total: int | None = None, note: str = "") -> None:
        """:meth:`set_progress` for an async task (the write runs in the worker's thread).

        Raises:
            ProgressError: as :meth:`set_progress`, before anything is written.
        """
        progress = validate_progress(done, total, note)
        await sync_to_async(self.control.progress.set)(progress)

    @classmethod
    def for_job(cls, job: Job, control: RunControl | None = None) -> JobContext:
        """Return the context of a run of ``job``, which a worker has just claimed.

        Args:
            job: a claimed job (``attempts`` >= 1 already counts this run).
            control: the run's control (default: one without limits, reading
                ``job``'s cancel mark on the default database).
        """
        attempt = max(1, job.attempts)
        reason: RunReason
        if attempt > 1:
            reason = "retry"
        else:
            window_reason = job.run_reason
            if window_reason == "quiet":
                reason = "quiet"
            elif window_reason == "max_wait":
                reason = "max_wait"
            else:
                reason = "not_debounced"
        return cls(
            job=job,
            attempt=attempt,
            calls_collapsed=job.enqueue_count - 1,
            run_reason=reason,
            control=control or RunControl(job.pk),
        )

    @classmethod
    def inline(cls) -> JobContext:
        """Return the context a direct (inline) call of the task receives: no job, attempt 1."""
        return cls(job=None, attempt=1, calls_collapsed=0, run_reason="inline")
