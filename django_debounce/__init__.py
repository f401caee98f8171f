"""django_debounce: debounce-first background jobs on the Django ORM.

Public API (contract §10): :func:`task`, :func:`debounced_task`, :func:`enqueue`;
also :func:`enqueue_many` (issue #12, the bulk enqueue).
Importing this package does not import models, so it is safe in settings and
in ``tasks.py`` modules loaded before the app registry is ready.

"§n" and "§n.m" in this package's comments and docstrings cite the behaviour
contract, ``docs/reference/contract.md``: section n, and item m of the numbered
list in section n (e.g. §4.5 is item 5 of §4, "Slide or insert, atomically").
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .breaker import CircuitBreaker
from .context import JobContext
from .schedules import Schedule
from .tasks import Task, debounced_task, periodic_task, task

if TYPE_CHECKING:
    from .models import Job

try:
    __version__ = version("django-debounce")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "CircuitBreaker",
    "JobContext",
    "Schedule",
    "Task",
    "__version__",
    "debounced_task",
    "enqueue",
    "enqueue_many",
    "periodic_task",
    "task",
]


def enqueue(task_name: str, args: Any = (), kwargs: Any = None, **options: Any) -> Job:
    """Enqueue a call of the task registered as ``task_name``; see :func:`django_debounce.enqueueing.call.enqueue`."""
    from .enqueueing.call import enqueue as _enqueue

    return _enqueue(task_name, args, kwargs, **options)


def enqueue_many(calls: Any, *, using: str | None = None) -> list[Job]:
    """Enqueue many calls in one transaction; see :func:`django_debounce.enqueueing.bulk.enqueue_many`."""
    from .enqueueing.bulk import enqueue_many as _enqueue_many

    return _enqueue_many(calls, using=using)
