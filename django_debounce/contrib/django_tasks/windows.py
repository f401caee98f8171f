"""A Django ``@task``'s window from code: the handles of ``Task.window`` for Django tasks (decision 198).

Django's ``Task`` has no room for methods of ours, so the handles are
functions taking the task: ``window(report, 7)`` is the window
``report.enqueue(7)`` would join, resolving the key exactly as ``enqueue``
does; ``window_for(report, "report:7")`` names it by its resolved key. They
return the :class:`~django_debounce.ops.window_handles.Window` that
``@debounced_task``'s ``task.window(...)`` returns, so ``pending()``,
``inspect()``, ``flush()`` and ``cancel()`` are the same (§4.1, §4.5; decision
180 for a leading or both task).
"""

from __future__ import annotations

from typing import Any

from ... import registry
from ...exceptions import ConfigurationError
from ...ops.window_handles import Window, window_of_call, windows_of_keys
from .results import DjangoTaskEntry, Task

__all__ = ["window", "window_for"]


def _entry(task: Task[..., Any]) -> DjangoTaskEntry:
    found = registry.lookup(getattr(task, "module_path", ""))
    if not isinstance(found, DjangoTaskEntry):
        raise ConfigurationError(
            f"{task!r} is not a Django task of DebounceBackend registered in this process; "
            "declare it with @task in <app>/tasks.py under TASKS "
            '{"BACKEND": "django_debounce.backends.DebounceBackend"}.'
        )
    return found


def window(task: Task[..., Any], *args: Any, **kwargs: Any) -> Window:
    """Return the handle of the window ``task.enqueue(*args, **kwargs)`` would join (no SQL).

    Args:
        task: a debounced Django ``@task`` of ``DebounceBackend``.
        args, kwargs: a call's arguments; the key template or callable
            resolves them as ``enqueue`` would (§3).

    Raises:
        ConfigurationError: ``task`` is not a Django task registered by this
            backend, or it is not debounced (no ``debounce=``).
        KeyResolutionError, PayloadError: the call's key does not resolve.
    """
    return window_of_call(_entry(task), args, kwargs, f"window of {task.module_path!r}")


def window_for(task: Task[..., Any], key: str, *, using: str | None = None) -> Window:
    """Return the handle of ``task``'s window for the resolved ``key`` (no SQL).

    Args:
        task: a debounced Django ``@task`` of ``DebounceBackend``.
        key: the resolved debounce key, e.g. ``"report:7"``.
        using: a database alias; ``None`` routes as the task's writes do.

    Raises:
        ConfigurationError: as :func:`window`.
        KeyResolutionError: ``key`` is not usable key text.
    """
    (found,) = windows_of_keys(_entry(task), [key], using=using)
    return found
