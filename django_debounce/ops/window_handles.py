"""A key's window from code: inspect it, flush it, cancel it (issue #21 item 1; §3, §4.1).

A :class:`Window` names one window by its identity, (task name, resolved key)
(§3), and a database alias. ``Task.window(*args, **kwargs)`` builds one from a
call's arguments, resolving the key exactly as ``delay`` would
(:func:`django_debounce.enqueueing.planning.debounce_key_of_call`); ``Task.window_for(key)``
from a key; ``Window(task_name, key)`` by name, from a process that never
imported the task. :class:`Windows` holds many, and does each operation for
all of them in one locking read.

``flush()`` and ``cancel()`` are :func:`django_debounce.ops.windows.run_now`
and :func:`~django_debounce.ops.windows.cancel` (the admin's "Run now" and
"Cancel") with ``only_open_windows=True``, on the key's open window, whose row
is locked first by its ``window_key`` (``SELECT … FOR UPDATE``): a concurrent
enqueue waits and then slides the flushed window or opens a new one behind the
cancelled one (§4.4), and a job a worker claimed (even a microsecond before) is
never changed (§4.5) but reported (``reason="claimed"``). Every operation runs
in ``transaction.atomic`` (a savepoint inside the caller's transaction), so it
commits or rolls back with the caller's work (§4.6).

No async twin (the package has no async API, decision 199): async code awaits
``sync_to_async(task.window(7).flush)()`` (docs/howto/windows-from-code.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction

from .. import databases, keys, registry
from ..enqueueing.planning import debounce_key_of_call, require_window
from ..exceptions import ConfigurationError, WindowContentionError
from ..models import Job
from ..registry import RegisteredTask
from ..validators import check_alias, check_task_name, checked_now
from . import windows as actions
from .cancels import CancelResult, cancel_jobs
from .contention import retrying
from .window_states import (
    WindowAction,
    WindowState,
    in_flight,
    pending_leading,
    shown,
    state_of,
    with_edge,
)

__all__ = [
    "Window",
    "WindowAction",
    "WindowState",
    "Windows",
    "window_of_call",
    "windows_of_calls",
    "windows_of_keys",
]

#: The logger of the operators' window actions (:mod:`django_debounce.ops.windows`).
logger = logging.getLogger("django_debounce.windows")

Status = Job.Status
#: Window keys per ``IN (…)`` (SQLite binds at most 999 parameters).
_CHUNK = 500
_T = TypeVar("_T")


@dataclass(frozen=True)
class Window:
    """The window of (task name, key) on one database: a handle, holding no row.

    Args:
        task_name: the task's registered name (``Job.task_name``).
        key: the resolved debounce key text (``Job.debounce_key``), not a template.
        using: database alias; ``None``: the router's choice for writing ``Job``.

    Raises:
        ConfigurationError: a task name ``Job.task_name`` cannot hold, an alias not in DATABASES.
        KeyResolutionError: a key that is not usable key text (§3: a ``str`` of at
            most 4,096 characters without NUL).
    """

    task_name: str
    key: str
    using: str | None = None

    def __post_init__(self) -> None:
        check_task_name(self.task_name)
        keys.check_key(self.key)
        check_alias(self.using, f"window of {self.task_name!r}")

    @property
    def window_key(self) -> str:
        """The window's identity as stored (``Job.window_key``/``key_hash``, 64 hex digits)."""
        return keys.window_hash(self.task_name, self.key)

    def on(self, using: str) -> Window:
        """Return this window's handle on database ``using``."""
        return replace(self, using=using)

    def pending(self) -> bool:
        """Return True while the key has an open window (§4.1): one query, no lock."""
        return (
            Job.objects.using(_db(self.using, self.task_name))
            .open_windows()
            .filter(window_key=self.window_key)
            .exists()
        )

    def inspect(self) -> WindowState | None:
        """Return the key's open window, else its claimed job, else ``None`` (one query)."""
        return Windows((self,)).inspect()[0]

    def flush(self, *, now: datetime | None = None) -> WindowAction:
        """Make the open window due now: ``run_at = min(run_at, now)``; the ceiling stays.

        It runs at the next claim that may take it (flow control still applies
        there). It stays open until a worker claims it, so a call arriving
        first still joins it and slides the deadline again, as after the
        admin's Run now (decision 54). A claimed job is not touched.

        Args:
            now: the new deadline, an aware datetime (else ConfigurationError); default now (§4.7).

        Returns:
            :class:`WindowAction`: ``"flushed"`` with the window after the flush,
            or ``"claimed"``/``"no_window"`` with nothing changed.
        """
        return Windows((self,)).flush(now=now)[0]

    def cancel(self, *, now: datetime | None = None) -> WindowAction:
        """End the open window unrun: ``CANCELLED``, no dead letter, no signal (§8).

        Jobs depending on it are cancelled too, transitively (§6); the key's
        next call opens a new window. A claimed job is not touched.

        Args:
            now: the ``finished_at`` written, an aware datetime (else ConfigurationError).

        Returns:
            :class:`WindowAction`: ``"cancelled"`` with what was cancelled (its
            calls and payload) and the dependents, or ``"claimed"``/``"no_window"``.
        """
        return Windows((self,)).cancel(now=now)[0]

    def cancel_running(self) -> CancelResult:
        """Ask the key's RUNNING job to stop, as ``Job.cancel()`` does (decision 186).

        Its task sees the request through its context and the job ends
        CANCELLED when it stops; the key's open window, if any, is left alone
        (:meth:`cancel` ends it). One indexed read, then
        :func:`~django_debounce.ops.cancels.cancel_jobs`.

        Returns:
            :class:`~django_debounce.ops.cancels.CancelResult`: ``requested``
            names the running job, empty when nothing of the key runs.
        """
        db = _db(self.using, self.task_name)
        running = Job.objects.using(db).running().filter(key_hash=self.window_key)
        return cancel_jobs(list(running.values_list("pk", flat=True)), using=db)


@dataclass(frozen=True)
class Windows:
    """Many windows on one database; each operation reads (and locks) them all at once.

    Results come back in the order of ``windows`` (a key given twice gets
    the same result twice).

    Raises:
        ConfigurationError: windows on different database aliases.
    """

    windows: tuple[Window, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", tuple(self.windows))
        aliases = {window.using for window in self.windows}
        if len(aliases) > 1:
            raise ConfigurationError(
                f"Windows: the windows name different databases {sorted(map(str, aliases))}; "
                "make one Windows per database."
            )

    def __iter__(self) -> Iterator[Window]:
        return iter(self.windows)

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def alias(self) -> str:
        """The database alias the operations use (the windows' ``using``, or the router's)."""
        if not self.windows:
            return _db(None, "")
        return _db(self.windows[0].using, self.windows[0].task_name)

    def on(self, using: str) -> Windows:
        """Return these windows' handles on database ``using``."""
        return Windows(tuple(window.on(using) for window in self.windows))

    def inspect(self) -> list[WindowState | None]:
        """Return :meth:`Window.inspect` of each window, from one query per 500 keys."""
        rows = _live_rows(self.windows, self.alias)
        return [
            with_edge(window, shown(window, rows.get(window.window_key, [])), self.alias)
            for window in self.windows
        ]

    def pending(self) -> list[bool]:
        """Return :meth:`Window.pending` of each window."""
        return [state is not None and state.open for state in self.inspect()]

    def flush(self, *, now: datetime | None = None) -> list[WindowAction]:
        """:meth:`Window.flush` each window, in one transaction (one lock, one update)."""
        db, now = self.alias, checked_now(now, "flush")

        def attempt() -> list[WindowAction]:
            with transaction.atomic(using=db):
                locked = _lock_open(self.windows, db)
                ids = [job.pk for job in locked.values()]
                done = set(actions.run_now(ids, now=now, only_open_windows=True, using=db).done)
                rows = _live_rows(self.windows, db)
            found: dict[str, WindowAction] = {}
            for window in self.windows:
                job = locked.get(window.window_key)
                if job is not None and job.pk in done:
                    state = shown(window, rows.get(window.window_key, []))
                    found[window.window_key] = WindowAction(True, "flushed", state)
            return [found.get(w.window_key) or _refused(w, rows) for w in self.windows]

        return retrying(attempt, db, "window flush", WindowContentionError)

    def cancel(self, *, now: datetime | None = None) -> list[WindowAction]:
        """:meth:`Window.cancel` each window, in one transaction (one lock; a cancel per window).

        Each window is cancelled on its own, so each result names its own
        dependents (one reached from two cancelled windows is named once).
        """
        db, now = self.alias, checked_now(now, "cancel")

        def attempt() -> list[WindowAction]:
            found: dict[str, WindowAction] = {}
            with transaction.atomic(using=db):
                locked = _lock_open(self.windows, db)
                before = _live_rows(self.windows, db)
                for window in self.windows:
                    job = locked.get(window.window_key)
                    if job is None or window.window_key in found:
                        continue
                    result = actions.cancel([job.pk], now=now, only_open_windows=True, using=db)
                    if result.done:
                        job.status, job.window_key, job.finished_at = Status.CANCELLED, None, now
                        others = [j for j in before.get(window.window_key, []) if j.pk != job.pk]
                        state = state_of(window, job, in_flight(others))
                        deps = tuple(result.cancelled_dependents)
                        leading = pending_leading(job, others)
                        if leading:  # a both burst's leading job, never claimed (decision 181)
                            ended = actions.cancel(leading, now=now, using=db)
                            deps += tuple(ended.cancelled_dependents)
                        found[window.window_key] = WindowAction(True, "cancelled", state, deps)
                rows = _live_rows(self.windows, db)
            return [found.get(w.window_key) or _refused(w, rows) for w in self.windows]

        return retrying(attempt, db, "window cancel", WindowContentionError)


def _db(using: str | None, task_name: str) -> str:
    """Return ``using``, or where the router writes the task's jobs (decision 224).

    The router is told the task's own ``queue=`` (a window a call moved to another
    queue with ``apply_async(queue=...)`` needs ``using=``); a task this process does not
    know is routed by its name alone.
    """
    if using:
        return using
    task = registry.lookup(task_name) if task_name else None
    if task is None:
        return router.db_for_write(Job, task_name=task_name or None) or DEFAULT_DB_ALIAS
    return databases.for_job(task.options.queue, task_name)


def _chunks(windows: Sequence[Window]) -> Iterator[list[str]]:
    hashes = list(dict.fromkeys(window.window_key for window in windows))
    for start in range(0, len(hashes), _CHUNK):
        yield hashes[start : start + _CHUNK]


def _live_rows(windows: Sequence[Window], db: str) -> dict[str, list[Job]]:
    """Return each key's READY and RUNNING jobs (its open window, its claimed job), by hash.

    One statement per chunk, so a window claimed while it is read shows up as
    open or as claimed, never as neither.
    """
    found: dict[str, list[Job]] = {}
    for chunk in _chunks(windows):
        qs = Job.objects.using(db).filter(
            key_hash__in=chunk, status__in=[Status.READY, Status.RUNNING]
        )
        for job in qs.order_by("pk"):
            found.setdefault(job.key_hash or "", []).append(job)
    return found


def _lock_open(windows: Sequence[Window], db: str) -> dict[str, Job]:
    """Lock the keys' open windows; return them by window hash.

    Found through ``window_key`` alone (its unique index; only a READY job
    holds one, a check constraint says so), so MariaDB/MySQL lock the index
    record before the row, in the order an enqueue takes them: the two never
    deadlock on a window.
    """
    found: dict[str, Job] = {}
    for chunk in _chunks(windows):
        qs = Job.objects.using(db).filter(window_key__in=chunk).order_by("window_key")
        if connections[db].features.has_select_for_update:
            qs = qs.select_for_update()
        found.update((job.window_key, job) for job in qs if job.window_key is not None)
    return found


def _refused(window: Window, rows: Mapping[str, list[Job]]) -> WindowAction:
    """The result for a key with no open window at the lock: its claimed job, or nothing.

    A window a call opened after the lock is not the one acted on (the action
    came first), so only claimed jobs are reported.
    """
    state = shown(window, rows.get(window.window_key, []), claimed_only=True)
    return WindowAction(False, "claimed" if state else "no_window", state)


def window_of_call(
    task: RegisteredTask, args: Sequence[object], kwargs: Mapping[str, object], where: str = ""
) -> Window:
    """Return the handle of the window ``task.delay(*args, **kwargs)`` would join (no SQL).

    Raises:
        ConfigurationError: the task is not debounced.
        KeyResolutionError, PayloadError: as
            :func:`~django_debounce.enqueueing.planning.debounce_key_of_call`.
    """
    where = where or f"window of {task.name!r}"
    return Window(task.name, debounce_key_of_call(task, args, kwargs, where))


def windows_of_calls(
    task: RegisteredTask, calls: Iterable[Sequence[object]], *, using: str | None = None
) -> Windows:
    """Return the windows of calls of ``task``, each given as a tuple of positional arguments.

    Raises:
        ConfigurationError: the task is not debounced; a call that is not a tuple or list.
        KeyResolutionError, PayloadError: a call's key does not resolve (the
            message names its index, ``call [i]``).
    """
    require_window(task, f"windows of {task.name!r}")
    found = []
    for index, call in enumerate(calls):
        where = f"windows of {task.name!r}: call [{index}]"
        if not isinstance(call, tuple | list):
            raise ConfigurationError(
                f"{where} is {call!r}; give each call's positional arguments as a tuple, "
                "e.g. task.windows([(1,), (2,)])."
            )
        found.append(replace(window_of_call(task, call, {}, where), using=using))
    return Windows(tuple(found))


def windows_of_keys(
    task: RegisteredTask, debounce_keys: Iterable[str], *, using: str | None = None
) -> Windows:
    """Return the windows of resolved keys of ``task``.

    Raises:
        ConfigurationError: the task is not debounced.
        KeyResolutionError: a key that is not usable key text.
    """
    require_window(task, f"windows of {task.name!r}")
    if isinstance(debounce_keys, str):  # not its characters: one key is window_for(key)
        raise ConfigurationError(f"windows_for({debounce_keys!r}) takes a list of keys")
    return Windows(tuple(Window(task.name, key, using) for key in debounce_keys))
