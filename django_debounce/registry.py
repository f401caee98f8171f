"""The process-wide task registry: task name -> the registered task.

The registry knows a task only through :class:`RegisteredTask` (what the
enqueue path and the worker read), so it imports nothing above
:mod:`django_debounce.options`; :class:`~django_debounce.tasks.Task` fits it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .exceptions import ConfigurationError, UnknownTaskError

if TYPE_CHECKING:
    import inspect

    from .options import TaskOptions


class RegisteredTask(Protocol):
    """What the registry holds for a task name (a :class:`~django_debounce.tasks.Task`)."""

    @property
    def name(self) -> str:
        """The registered name (``Job.task_name``)."""

    @property
    def func(self) -> Callable[..., Any]:
        """The user's function: any arguments, any result (with ``takes_context``, the context first)."""

    @property
    def options(self) -> TaskOptions:
        """The task's validated options."""

    @property
    def signature(self) -> inspect.Signature:
        """The signature key templates bind against (§3)."""

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` function."""


_tasks: dict[str, RegisteredTask] = {}


def _same_function(a: Callable[..., object], b: Callable[..., object]) -> bool:
    """True for one function, or the same definition imported twice (same file and line)."""
    return bool(
        a is b
        or (
            a.__module__ == b.__module__
            and a.__qualname__ == b.__qualname__
            and getattr(a, "__code__", None) is not None
            and getattr(b, "__code__", None) is not None
            and a.__code__.co_filename == b.__code__.co_filename
            and a.__code__.co_firstlineno == b.__code__.co_firstlineno
        )
    )


def register(task: RegisteredTask) -> None:
    """Register ``task`` under ``task.name``.

    Re-registering the same function (a module imported twice) replaces the
    entry.

    Raises:
        ConfigurationError: a different function already holds the name (§2).
    """
    existing = _tasks.get(task.name)
    if existing is not None and not _same_function(existing.func, task.func):
        raise ConfigurationError(
            f"task name {task.name!r} is already taken by "
            f"{existing.func.__module__}.{existing.func.__qualname__}; pass a different name= "
            "to one of the decorators."
        )
    _tasks[task.name] = task


def get_task(name: str) -> RegisteredTask:
    """Return the task registered under ``name``.

    Raises:
        UnknownTaskError: no task of that name is registered in this process.
    """
    try:
        return _tasks[name]
    except KeyError:
        raise UnknownTaskError(f"no task named {name!r} is registered in this process") from None


def lookup(name: str) -> RegisteredTask | None:
    """Return the task registered under ``name``, or ``None``."""
    return _tasks.get(name)


def unregister(name: str) -> None:
    """Forget the task registered under ``name`` (for tests)."""
    _tasks.pop(name, None)


def all_tasks() -> dict[str, RegisteredTask]:
    """Return a copy of the registry."""
    return dict(_tasks)
