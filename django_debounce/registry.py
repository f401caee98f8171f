"""The process-wide task registry: task name -> :class:`~django_debounce.tasks.Task`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import ConfigurationError, UnknownTaskError

if TYPE_CHECKING:
    from .tasks import Task

_tasks: dict[str, Task[Any, Any]] = {}


def _same_function(a: Any, b: Any) -> bool:
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


def register(task: Task[Any, Any]) -> None:
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


def get_task(name: str) -> Task[Any, Any]:
    """Return the task registered under ``name``.

    Raises:
        UnknownTaskError: no task of that name is registered in this process.
    """
    try:
        return _tasks[name]
    except KeyError:
        raise UnknownTaskError(f"no task named {name!r} is registered in this process") from None


def lookup(name: str) -> Task[Any, Any] | None:
    """Return the task registered under ``name``, or ``None``."""
    return _tasks.get(name)


def unregister(name: str) -> None:
    """Forget the task registered under ``name`` (for tests)."""
    _tasks.pop(name, None)


def all_tasks() -> dict[str, Task[Any, Any]]:
    """Return a copy of the registry."""
    return dict(_tasks)
