"""Which executor runs a task's jobs, and the task names each executor's claim takes (issue #10).

A task runs on the built-in worker (``run_debounce_worker``) or on Celery:
its ``executor=`` option, else ``DEBOUNCE_EXECUTOR`` (decision 85). The claim
of each executor takes only its own tasks' jobs (:func:`claim_filter`), so a
``run_debounce_worker`` never runs a job meant for Celery and the Celery
scheduler never hands off a job meant for the built-in worker. Pure Python,
no query: it reads this process's registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import registry
from ..conf import settings
from ..conf.executor import EXECUTORS, parse_executor


@dataclass(frozen=True)
class ExecutorTaskFilter:
    """The task names an executor's claim may take (:func:`claim_filter`; part of the claim's cache key).

    Attributes:
        only: take only jobs of these task names (sorted); ``None``: any name.
        skip: leave out jobs of these task names (sorted).
    """

    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()

    @property
    def takes_nothing(self) -> bool:
        """True when no job can pass: ``only`` is empty."""
        return self.only is not None and not self.only


#: The filter that leaves every job in (no SQL added).
ANY_TASK = ExecutorTaskFilter()


def executor_of(task_name: str) -> str:
    """Return the executor of ``task_name``: its ``executor=`` option, else ``DEBOUNCE_EXECUTOR``.

    A name not registered in this process follows ``DEBOUNCE_EXECUTOR``.

    Raises:
        ConfigurationError: ``DEBOUNCE_EXECUTOR`` is invalid (check E025).
    """
    task = registry.lookup(task_name)
    if task is not None and task.options.executor is not None:
        return task.options.executor
    return settings.executor


def claim_filter(executor: str) -> ExecutorTaskFilter:
    """Return the task names the claim of ``executor`` takes (decision 86).

    The executor of ``DEBOUNCE_EXECUTOR`` takes every job except those of
    tasks registered here with the other executor (so a name no task here
    registers, e.g. enqueued by name from another service, goes to the
    default executor, which dead-letters it as ``unknown_task:`` if it is
    unknown there too); the other executor takes only its own registered
    tasks. With every task on the default executor the filter is
    :data:`ANY_TASK`: the claim runs exactly as without executors.

    Args:
        executor: ``"worker"`` or ``"celery"``.

    Raises:
        ConfigurationError: ``executor`` or ``DEBOUNCE_EXECUTOR`` is not one of them.
    """
    parse_executor(executor, where="executor")
    default = settings.executor
    others = sorted(
        name
        for name, task in registry.all_tasks().items()
        if task.options.executor is not None and task.options.executor != default
    )
    if executor == default:
        return ExecutorTaskFilter(skip=tuple(others)) if others else ANY_TASK
    return ExecutorTaskFilter(only=tuple(others))


__all__ = ["ANY_TASK", "EXECUTORS", "ExecutorTaskFilter", "claim_filter", "executor_of"]
