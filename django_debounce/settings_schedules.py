"""Periodic schedules declared in settings (``DEBOUNCE_SCHEDULES``), resolved against the registry (decision 209).

A schedule in settings is a schedule of the task it names, as if declared with
``@task(schedule=Schedule(...))``: the same checks (:func:`~django_debounce.schedules.declare_schedules`:
the cron expression, the zone, the arguments against the task's signature and
the codec; :func:`~django_debounce.schedules.check_schedule_keys`: its key
templates) and the same ticks, one job each
(:mod:`django_debounce.ops.periodic`). They can only be checked once the task
is registered, so they are resolved when the schedules are listed, not when
the setting is read: ``manage.py check`` (and so ``run_debounce_worker``,
which runs the checks first) reports a broken entry under
``django_debounce.E048``; a process that skipped the checks logs the entry's
error once and leaves that schedule out.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, replace

from . import registry
from .conf import settings
from .conf.schedules import ScheduleSetting
from .exceptions import ConfigurationError
from .registry import RegisteredTask
from .schedules import Schedule, check_schedule_keys, declare_schedules

logger = logging.getLogger("django_debounce.periodic")

__all__ = ["Resolved", "settings_schedules"]


@dataclass(frozen=True)
class Resolved:
    """``DEBOUNCE_SCHEDULES`` resolved: the schedules that run, and the entries refused.

    Attributes:
        schedules: (task, schedule) pairs, by schedule name; each schedule checked
            against its task and named after its entry.
        errors: entry name -> the :class:`~django_debounce.exceptions.ConfigurationError`
            that keeps it from running (an unknown task, a bad cron expression or
            zone, arguments that do not fit, a name another schedule holds).
    """

    schedules: tuple[tuple[RegisteredTask, Schedule], ...]
    errors: dict[str, ConfigurationError]


#: What a resolution depends on: the setting's entries, the tasks they name, the code's names.
_Key = tuple[
    tuple[ScheduleSetting, ...], tuple[RegisteredTask | None, ...], tuple[tuple[str, str], ...]
]
_kept: tuple[_Key, Resolved] | None = None
_logged: set[tuple[str, str]] = set()


def settings_schedules(*, log: bool = True) -> Resolved:
    """Resolve ``DEBOUNCE_SCHEDULES`` against the tasks registered in this process.

    Kept until the setting or a task it names changes (one dict lookup per
    entry per call: the worker lists the schedules on every poll).

    Args:
        log: log each refused entry's error once per process (``action=
            "periodic_settings_error"``); the system check passes False.

    Returns:
        A :class:`Resolved`.

    Raises:
        ConfigurationError: the setting itself has the wrong shape (check E047).
    """
    global _kept
    entries: tuple[ScheduleSetting, ...] = settings.schedules
    tasks = tuple(registry.lookup(entry.task) for entry in entries)
    code_names = _code_schedule_names() if entries else {}
    key: _Key = (entries, tasks, tuple(sorted(code_names.items())))
    if _kept is not None and _same(_kept[0], key):
        resolved = _kept[1]
    else:
        resolved = _resolve(entries, tasks, code_names)
        _kept = (key, resolved)
    if log:
        for name, error in resolved.errors.items():
            if (name, str(error)) not in _logged:
                _logged.add((name, str(error)))
                logger.error(
                    "%s This schedule does not run (manage.py check reports it as "
                    "django_debounce.E048).",
                    error,
                    extra={"action": "periodic_settings_error", "schedule": name},
                )
    return resolved


def _same(a: _Key, b: _Key) -> bool:
    """The same setting value, the same task objects, the same code schedules."""
    return a[0] is b[0] and all(x is y for x, y in zip(a[1], b[1], strict=True)) and a[2] == b[2]


def _code_schedule_names() -> dict[str, str]:
    """Schedule name -> task name, for the schedules declared in code."""
    return {
        (schedule.name or task.name): task.name
        for task in registry.all_tasks().values()
        for schedule in task.options.schedule
        if isinstance(schedule, Schedule)
    }


def _resolve(
    entries: tuple[ScheduleSetting, ...],
    tasks: tuple[RegisteredTask | None, ...],
    code_names: dict[str, str],
) -> Resolved:
    found: list[tuple[RegisteredTask, Schedule]] = []
    errors: dict[str, ConfigurationError] = {}
    for entry, task in zip(entries, tasks, strict=True):
        try:
            found.append((task, _checked(entry, task, code_names)))  # type: ignore[arg-type]
        except ConfigurationError as exc:
            errors[entry.name] = exc
    return Resolved(tuple(found), errors)


def _checked(
    entry: ScheduleSetting, task: RegisteredTask | None, code_names: dict[str, str]
) -> Schedule:
    where = f"DEBOUNCE_SCHEDULES[{entry.name!r}]"
    if task is None:
        close = difflib.get_close_matches(entry.task, list(registry.all_tasks()), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigurationError(
            f"{where}: no task named {entry.task!r} is registered. A task's name is its "
            f"module and function ('reports.tasks.build_report') unless name= gave "
            f"another; its module must be imported at startup (a tasks.py of an "
            f"installed app is).{hint}"
        )
    if entry.name in code_names:
        raise ConfigurationError(
            f"{where}: the name is already a schedule of task {code_names[entry.name]!r}, "
            "declared in code; give the entry another name."
        )
    schedule = Schedule(
        entry.cron,
        tz=entry.tz,
        args=entry.args,
        kwargs=entry.kwargs,
        name=entry.name,
        overlap=entry.overlap,
        pass_tick=entry.pass_tick,
        max_lateness=entry.max_lateness,
    )
    try:
        (checked,) = declare_schedules(schedule, task_name=task.name, signature=task.signature)
        check_schedule_keys(_Scheduled(task, checked))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return checked


class _Scheduled:
    """``task`` with ``schedule`` as its only schedule (what :func:`check_schedule_keys` reads)."""

    def __init__(self, task: RegisteredTask, schedule: Schedule) -> None:
        self._task = task
        self.options = replace(task.options, schedule=(schedule,))

    name = property(lambda self: self._task.name)
    func = property(lambda self: self._task.func)
    signature = property(lambda self: self._task.signature)
    is_async = property(lambda self: self._task.is_async)
