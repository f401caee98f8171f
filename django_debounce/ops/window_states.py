"""What a window handle reports: a window's state, and what a flush or cancel did (issue #21).

:mod:`django_debounce.ops.window_handles` reads the rows; this module turns
a key's live jobs (READY and RUNNING) into the :class:`WindowState` shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from django.utils import timezone

from .. import codec, registry
from ..enqueueing import edges
from ..models import Job

__all__ = [
    "WindowAction",
    "WindowState",
    "in_flight",
    "pending_leading",
    "shown",
    "state_of",
    "with_edge",
]

Status = Job.Status


class WindowIdentity(Protocol):
    """A window's identity (a :class:`~django_debounce.ops.window_handles.Window`)."""

    @property
    def task_name(self) -> str:
        """The task's registered name."""

    @property
    def key(self) -> str:
        """The resolved debounce key."""

    @property
    def window_key(self) -> str:
        """The window's identity as stored (``Job.key_hash``)."""


@dataclass(frozen=True)
class WindowState:
    """A snapshot of the job a key's window is (or became), read from its row.

    The job is the key's open window when one is open; otherwise the key's job
    a worker claimed: ``RUNNING``, or ``READY`` again waiting for a retry (its
    window closed at the claim, §4.1).
    """

    task_name: str
    key: str
    """The resolved debounce key text (``Job.debounce_key``)."""
    job_id: int
    status: str
    """``Job.Status`` value: ``"READY"``, ``"RUNNING"``, or ``"CANCELLED"`` in what cancel returns."""
    open: bool
    """True while the window is open: READY and never claimed; a call now joins it (§4.1)."""
    running: bool
    """True when a worker has claimed this job and runs it (``RUNNING``)."""
    opened_at: datetime | None
    """When the window opened (the first call)."""
    last_call_at: datetime
    """When the last call joined (``Job.last_enqueued_at``)."""
    deadline: datetime
    """``Job.run_at``: when the job is due, ``min(last call + window, ceiling)`` unless flushed."""
    ceiling: datetime | None
    """``Job.max_run_at``: ``opened_at + max wait``, fixed when the window opened (§4.2)."""
    calls: int
    """Every call the job serves (``Job.enqueue_count``)."""
    calls_collapsed: int
    """Calls that joined after the one that opened it: ``calls - 1`` (decision 161)."""
    args: tuple[Any, ...]
    """The positional arguments the job runs with, decoded (§5)."""
    kwargs: dict[str, Any]
    """The keyword arguments the job runs with, decoded (§5)."""
    run_in_flight: int | None
    """Id of the key's job a worker is running now: this job when :attr:`running`, else an
    earlier run the open window waits behind (§4.5); ``None`` when no run is in flight."""
    edge: str = "trailing"
    """The task's ``debounce_edge`` (decision 180); ``"trailing"`` for a task this process
    never imported."""
    burst_until: datetime | None = None
    """A leading or both task: when the key's burst closes, ``min(last call + window,
    ceiling)``, while one is open (a call before then is swallowed, or gathered into the
    trailing job); ``None`` when no burst is open, and for a trailing task."""

    @property
    def payload(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)``: the call the job would run with (the first, last or merged, §4.8)."""
        return self.args, self.kwargs


@dataclass(frozen=True)
class WindowAction:
    """What ``flush()`` or ``cancel()`` did to one key's window."""

    done: bool
    """True when the open window was flushed or cancelled."""
    reason: Literal["flushed", "cancelled", "claimed", "no_window"]
    """``"claimed"``: no open window, but the key's job a worker claimed (running, or waiting
    for a retry), left untouched; ``"no_window"``: nothing open or claimed for the key."""
    window: WindowState | None
    """Flushed: the window after the flush. Cancelled: the window as it was cancelled
    (``status="CANCELLED"``, its calls and payload). Claimed: that job. Else ``None``."""
    cancelled_dependents: tuple[int, ...] = ()
    """Cancel only: the jobs cancelled with the window because they depended on it (§6)."""


def in_flight(jobs: Iterable[Job]) -> int | None:
    """Return the id of the RUNNING job among a key's ``jobs`` (the newest), or ``None``."""
    running = [job.pk for job in jobs if job.status == Status.RUNNING]
    return max(running) if running else None


def pending_leading(job: Job, others: Sequence[Job]) -> list[int]:
    """Return the ids of the unclaimed jobs of ``job``'s burst beside it (decision 181).

    A both burst's trailing job holds the key's window; its leading job, due
    at once, may still wait unclaimed (a busy worker, a breaker, a cap). It
    shares the burst's ``opened_at`` and ceiling and was never claimed
    (``attempts == 0``). Cancelling the window ends it too: a cancelled window
    never runs, nor does the call that opened it. A claimed one is left alone (§4.5).
    """
    return [
        other.pk
        for other in others
        if other.status == Status.READY
        and other.window_key is None
        and other.attempts == 0
        and job.max_run_at is not None
        and other.opened_at == job.opened_at
        and other.max_run_at == job.max_run_at
    ]


def state_of(window: WindowIdentity, job: Job, run_in_flight: int | None) -> WindowState:
    """Return the :class:`WindowState` of ``job``, the job of ``window``'s key (no SQL)."""
    args, kwargs = codec.decode_call(job.args, job.kwargs)
    return WindowState(
        task_name=window.task_name,
        key=window.key,
        job_id=job.pk,
        status=job.status,
        open=job.is_open_window,
        running=job.status == Status.RUNNING,
        opened_at=job.opened_at,
        last_call_at=job.last_enqueued_at,
        deadline=job.run_at,
        ceiling=job.max_run_at,
        calls=job.enqueue_count,
        calls_collapsed=job.enqueue_count - 1,
        args=tuple(args),
        kwargs=kwargs,
        run_in_flight=run_in_flight,
    )


def shown(
    window: WindowIdentity, jobs: Sequence[Job], *, claimed_only: bool = False
) -> WindowState | None:
    """The state of the key's job to show: its open window, else its claimed job (running first)."""
    open_window = None if claimed_only else next((j for j in jobs if j.window_key), None)
    claimed = [job for job in jobs if job.window_key is None]
    running = [job for job in claimed if job.status == Status.RUNNING]
    job = open_window or next(reversed(running or claimed), None)
    return None if job is None else state_of(window, job, in_flight(jobs))


def with_edge(window: WindowIdentity, state: WindowState | None, db: str) -> WindowState | None:
    """Return ``state`` with the edge of ``window``'s task and its open burst (decision 180).

    A trailing task (or one this process never imported) costs nothing; a
    leading or both task reads its key's burst (one query). A leading burst
    whose job already ran shows that job, with :attr:`WindowState.burst_until` set.
    """
    found = registry.lookup(window.task_name)
    edge = found.options.debounce_edge if found is not None else "trailing"
    if found is None or edge == "trailing" or found.options.debounce is None:
        return state
    now = timezone.now()
    rows = edges.burst_rows(window.window_key, now, db, lock=False)
    burst = edges.open_burst(rows, found.options.debounce, now)
    if state is None and burst:
        state = state_of(window, burst[0], None)
    if state is None:
        return None
    until = edges.closes_at(burst[0], found.options.debounce) if burst else None
    return replace(state, edge=edge, burst_until=until)
