"""Call a task under its run's control: time limits and cancel requests (decisions 186, 187).

:func:`control_for` builds the :class:`~django_debounce.run_controls.RunControl`
of a run (its ``timeout``: the call's, else the task's; the hard limit of a
sync task, ``timeout + DEBOUNCE_TIMEOUT_GRACE``; the cancel mark the claim
read). :func:`call_task` calls the task: a sync one plainly (it observes its
limits through its context), an async one as an asyncio task that is
cancelled at its ``timeout`` (:class:`~django_debounce.exceptions.JobTimeout`)
or when its cancel is requested (a watcher reads the mark once per
``DEBOUNCE_CANCEL_POLL_INTERVAL``: :class:`~django_debounce.exceptions.JobCancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError, InterfaceError

from ..conf import settings
from ..exceptions import JobCancelled, JobTimeout
from ..models import Job
from ..progress import ProgressReporter
from ..registry import RegisteredTask
from ..run_controls import RunControl

#: The worker's documented logger (docs/reference/commands.md).
logger = logging.getLogger("django_debounce.worker")


def control_for(job: Job, task: RegisteredTask, *, using: str) -> RunControl:
    """Return the control of the run of ``job`` (claimed) starting now.

    The limit is ``job.timeout`` (the call's), else the task's ``timeout``
    option, else none. A sync task's hard limit is that plus
    ``DEBOUNCE_TIMEOUT_GRACE``; an async task has none (it is cancelled at
    its limit). A job claimed with its cancel already requested starts
    cancelled. Its progress writes are fenced on the claim's attempt and
    worker (:class:`~django_debounce.progress.ProgressReporter`, decision 202).
    """
    limit = job.timeout or task.options.timeout
    seconds = None if limit is None else limit.total_seconds()
    grace = None if task.is_async else settings.timeout_grace.total_seconds()
    control = RunControl(
        job.pk,
        using=using,
        timeout=seconds,
        grace=grace,
        poll_interval=settings.cancel_poll_interval,
        progress=ProgressReporter(job, using=using),
    )
    if job.cancel_requested_at is not None:
        control.note_cancel_requested()
    return control


def call_task(
    task: RegisteredTask, args: Sequence[Any], kwargs: dict[str, Any], control: RunControl
) -> object:
    """Call ``task`` with ``args``/``kwargs`` under ``control``; return what it returned.

    Raises:
        JobTimeout: an async task was cancelled at its limit.
        JobCancelled: an async task was cancelled because its cancel was requested.
        BaseException: whatever the task raised.
    """
    if task.is_async:
        return async_to_sync(_run_async)(task.func, args, kwargs, control)
    return task.func(*args, **kwargs)


async def _run_async(
    func: Callable[..., Coroutine[Any, Any, object]],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    control: RunControl,
) -> object:
    inner = asyncio.ensure_future(func(*args, **kwargs))
    cancelled: list[bool] = []
    watcher = asyncio.ensure_future(_watch(inner, control, cancelled))
    try:
        left = control.time_left()
        if left is None:
            return await inner
        return await asyncio.wait_for(inner, max(left, 0.0))
    except asyncio.CancelledError:
        if cancelled:
            raise JobCancelled(
                f"job {control.job_id} was cancelled while it ran (a cancel request)"
            ) from None
        raise
    except TimeoutError:
        if control.timed_out() and inner.cancelled():
            raise JobTimeout(control.timeout_message()) from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _watch(inner: asyncio.Future[object], control: RunControl, cancelled: list[bool]) -> None:
    """Cancel ``inner`` once the job's cancel mark is read (in the worker's thread, its connection)."""
    if control.job_id is None:
        return
    read = sync_to_async(control.read_cancel)  # thread-sensitive: the calling thread's connection
    while not inner.done():
        if control.cancel_known:
            cancelled.append(True)
            inner.cancel()
            return
        await asyncio.sleep(control.poll_interval)
        try:
            await read()
        except (DatabaseError, InterfaceError):  # the task runs on; read again next interval
            logger.warning(
                "could not read the cancel mark of job %s", control.job_id, exc_info=True
            )


__all__ = ["call_task", "control_for"]
