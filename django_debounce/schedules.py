"""Periodic schedules: a cron expression in a time zone, and its ticks (docs/explanation/semantics.md, "Periodic tasks").

A :class:`Schedule` is declared on a task (``@task(schedule=...)`` or
:func:`~django_debounce.periodic_task`) and checked there, before
anything is written: a cron expression the parser refuses, an unknown time
zone, arguments that do not fit the task's signature or that the codec cannot
store are a :class:`~django_debounce.exceptions.ConfigurationError` naming the
task. The ticks come from `cronsim <https://pypi.org/project/cronsim/>`_, which
follows Debian's cron across DST changes (docs/howto/periodic-tasks.md):

* a tick that falls in the hour a spring-forward skips runs at the first
  instant after the jump (``30 2 * * *`` in Europe/Paris runs at 03:00 CEST
  that day);
* a tick in the hour a fall-back repeats runs once, in its first occurrence
  (``30 2 * * *`` runs at 02:30 CEST, not again at 02:30 CET);
* expressions whose minute or hour field starts with ``*`` (``*/15 * * * *``,
  ``0 * * * *``) and six-field ones are scheduled on the instants the local
  clock shows them: none in a skipped hour, both occurrences of a repeated one.

This module reads no database; :mod:`django_debounce.ops.periodic` defers the ticks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.conf import settings as django_settings
from django.utils import timezone

from . import codec
from .conf.durations import DurationLike, parse_duration
from .exceptions import ConfigurationError, KeyResolutionError, PayloadError

if TYPE_CHECKING:
    from .options import TaskOptions
    from .registry import RegisteredTask

__all__ = ["MAX_NAME_LENGTH", "Schedule", "check_schedule_keys", "declare_schedules"]

#: The longest schedule name (``PeriodicTick.schedule``).
MAX_NAME_LENGTH = 200


@dataclass(frozen=True)
class Schedule:
    """When a task runs by itself: a cron expression in a time zone (docs/explanation/semantics.md, "Periodic tasks").

    Args:
        cron: a cron expression of five fields (minute hour day month weekday)
            or six (seconds first), as cronsim reads it (``"*/5 * * * *"``,
            ``"0 3 * * MON-FRI"``, ``"0 0 L * *"``).
        tz: an IANA zone name (``"Europe/Paris"``) or a ``tzinfo``; ``None``:
            Django's ``TIME_ZONE`` when the tick is computed.
        args, kwargs: the arguments of every job (fixed; stored through the codec, §5).
        name: the schedule's name, unique in the deployment (its ticks are
            recorded under it); default: the task's name.
        overlap: when false (the default), a tick is skipped while the job of
            the schedule's previous tick is READY or RUNNING.
        pass_tick: pass the tick's instant (an aware ``datetime`` in ``tz``)
            as the keyword argument ``tick``.
            ``overlap`` and ``pass_tick`` are bools (``"no"`` is refused, not taken as true).
        max_lateness: the latest a tick may be deferred after its instant (a
            duration); ``None``: ``DEBOUNCE_PERIODIC_MAX_LATENESS``. After a
            downtime only the latest missed tick within it runs.

    Raises:
        ConfigurationError: from :func:`~django_debounce.schedules.declare_schedules`, when the task is declared.
    """

    cron: str
    tz: str | tzinfo | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    overlap: bool = False
    pass_tick: bool = False
    max_lateness: DurationLike | None = None

    @property
    def zone(self) -> tzinfo:
        """The time zone the expression is read in (a ``ZoneInfo``, or the ``tzinfo`` given)."""
        if isinstance(self.tz, tzinfo):
            return self.tz
        return ZoneInfo(self.tz or django_settings.TIME_ZONE or "UTC")

    def lateness(self) -> timedelta:
        """The lateness cap in force (the schedule's, else the setting's)."""
        if self.max_lateness is not None:
            return parse_duration(self.max_lateness, name="max_lateness")
        from .conf import settings

        return settings.periodic_max_lateness  # type: ignore[no-any-return]

    def next_after(self, instant: datetime) -> datetime | None:
        """Return the first tick strictly after ``instant`` (aware, in :attr:`zone`), or ``None``.

        ``None``: no tick in the next 50 years (cronsim's horizon).
        """
        ticks = CronSim(self.cron, instant.astimezone(self.zone))
        try:
            return next(ticks)
        except StopIteration:
            return None

    def latest_until(self, start: datetime, end: datetime) -> datetime | None:
        """Return the last tick in ``(start, end]``, or ``None`` if there is none."""
        ticks = CronSim(self.cron, start.astimezone(self.zone))
        latest = None
        for tick in ticks:
            if tick > end:
                break
            latest = tick
        return latest


def declare_schedules(
    value: object, *, task_name: str, signature: inspect.Signature
) -> tuple[Schedule, ...]:
    """Check a task's ``schedule=`` option and return its schedules, each named (semantics, "Periodic tasks").

    Args:
        value: a cron string, a :class:`Schedule`, or a list/tuple of them; ``None``: none.
        task_name: the task's name (messages; the default schedule name).
        signature: what the task's calls bind against (the schedule's arguments must fit).

    Raises:
        ConfigurationError: a bad cron expression, an unknown zone, arguments
            that do not fit ``signature`` or that the codec cannot store, a
            lateness that is not a duration, ``overlap``/``pass_tick`` that are
            not bools, a ``tz`` that is neither a zone name nor a ``tzinfo``,
            two schedules of the task with one name, or a name that is not text
            of 1..200 characters.
    """
    if value is None:
        return ()
    items: Iterable[object] = value if isinstance(value, list | tuple) else [value]
    found: list[Schedule] = []
    for item in items:
        if isinstance(item, str):
            item = Schedule(item)
        if not isinstance(item, Schedule):
            raise ConfigurationError(
                f"task {task_name!r}: schedule= takes a cron string such as '*/5 * * * *', "
                f"a django_debounce.Schedule, or a list of them; got {item!r}."
            )
        found.append(_check(item, task_name, signature))
    names = [s.name or task_name for s in found]
    if len(set(names)) != len(names):
        raise ConfigurationError(
            f"task {task_name!r}: two schedules are named {sorted(names)}; give each "
            "Schedule its own name= (the ticks of a schedule are recorded under its name)."
        )
    return tuple(found)


def check_schedule_keys(task: RegisteredTask) -> None:
    """Refuse a schedule of ``task`` whose fixed arguments cannot resolve its keys (decision 191).

    Each schedule's ``args``/``kwargs`` (with ``tick=`` under ``pass_tick=True``)
    are planned as ``task.delay`` plans a call
    (:func:`~django_debounce.enqueueing.planning.plan_call`, no SQL), once per
    key template: the task's ``debounce_key`` and its ``unique_key``. A key
    given as a callable is user code and is not run at declaration (its
    failures are the ticks' ``outcome="error"``).

    Args:
        task: a task whose ``options.schedule`` were checked by :func:`declare_schedules`.

    Raises:
        ConfigurationError: naming the schedule, the key option and template,
            and what does not resolve (say, a ``{user}`` with no ``user=``).
    """
    # Kernel -> enqueueing, lazily: a declaration plans its ticks' calls as delay does.
    from .enqueueing.planning import plan_call

    options = task.options
    templates = {
        option: spec
        for option, spec in (
            ("debounce_key", options.debounce_key),
            ("unique_key", options.unique_key),
        )
        if isinstance(spec, str)
    }
    for schedule in options.schedule:
        if not isinstance(schedule, Schedule) or not templates:
            continue
        kwargs = dict(schedule.kwargs)
        if schedule.pass_tick:
            kwargs["tick"] = datetime.now(schedule.zone)
        for option, spec in templates.items():
            only = replace(  # the other key left to its default: the message names one option
                options,
                debounce_key=spec if option == "debounce_key" else None,
                unique_key=spec if option == "unique_key" else None,
            )
            try:
                plan_call(
                    _Planned(task, only), task.name, schedule.args, kwargs, {}, timezone.now()
                )
            except (KeyResolutionError, PayloadError) as exc:
                why = str(exc).removeprefix(f"enqueue of {task.name!r}: ").rstrip(".")
                raise ConfigurationError(
                    f"task {task.name!r}: schedule {schedule.name!r} ({schedule.cron!r}): its "
                    f"args/kwargs cannot resolve the task's {option} {spec!r}, so every tick "
                    f"would fail: {why}. Give the Schedule the argument(s) the key uses."
                ) from None


@dataclass(frozen=True)
class _Planned:
    """``task`` seen with other options (a :class:`~django_debounce.registry.RegisteredTask`)."""

    task: RegisteredTask
    options: TaskOptions

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def func(self) -> Callable[..., Any]:
        return self.task.func

    @property
    def signature(self) -> inspect.Signature:
        return self.task.signature

    @property
    def is_async(self) -> bool:
        return self.task.is_async


def _zone_name(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _check(schedule: Schedule, task_name: str, signature: inspect.Signature) -> Schedule:
    where = f"task {task_name!r}: schedule {schedule.cron!r}"
    if not isinstance(schedule.cron, str):
        raise ConfigurationError(f"{where}: the cron expression must be a string.")
    try:
        CronSim(schedule.cron, datetime(2000, 1, 1))
    except (CronSimError, ValueError) as exc:
        raise ConfigurationError(
            f"{where} is not a cron expression ({exc}); give five fields, minute hour "
            "day-of-month month day-of-week, e.g. '*/5 * * * *' or '0 3 * * MON-FRI'."
        ) from None
    for flag in ("overlap", "pass_tick"):
        if not isinstance(getattr(schedule, flag), bool):
            raise ConfigurationError(
                f"{where}: {flag}= takes True or False, got {getattr(schedule, flag)!r}."
            )
    if not (schedule.tz is None or isinstance(schedule.tz, tzinfo) or _zone_name(schedule.tz)):
        raise ConfigurationError(
            f"{where}: tz= takes a time zone: an IANA name such as 'Europe/Paris' or 'UTC', "
            f"a tzinfo, or None (settings.TIME_ZONE); got {schedule.tz!r}."
        )
    try:
        schedule.zone  # noqa: B018 - resolving the zone is the check
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigurationError(
            f"{where}: unknown time zone {schedule.tz!r}; give an IANA name such as "
            "'Europe/Paris' or 'UTC' (tz=None: settings.TIME_ZONE)."
        ) from None
    if schedule.max_lateness is not None:
        try:
            parse_duration(schedule.max_lateness, name="max_lateness")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    name = task_name if schedule.name is None else schedule.name
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{where}: name= must be text of 1 to {MAX_NAME_LENGTH} characters, got {name!r}."
        )
    if not codec.is_storable_text(name):
        raise ConfigurationError(
            f"{where}: name= may not hold a NUL character or a lone surrogate (no supported "
            f"database can store it), got {name!r}."
        )
    if isinstance(schedule.args, str | bytes) or not isinstance(schedule.args, Sequence):
        raise ConfigurationError(f"{where}: args= must be a tuple or list, got {schedule.args!r}.")
    if not isinstance(schedule.kwargs, Mapping) or not all(
        isinstance(k, str) for k in schedule.kwargs
    ):
        raise ConfigurationError(
            f"{where}: kwargs= must be a dict with str keys, got {schedule.kwargs!r}."
        )
    args, kwargs = list(schedule.args), dict(schedule.kwargs)
    bound_kwargs = {**kwargs, "tick": datetime.now().astimezone()} if schedule.pass_tick else kwargs
    try:
        signature.bind(*args, **bound_kwargs)
    except TypeError as exc:
        hint = " (pass_tick=True passes tick=)" if schedule.pass_tick else ""
        raise ConfigurationError(
            f"{where}: its args/kwargs do not fit the task's signature {signature}{hint}: {exc}."
        ) from None
    try:
        codec.encode_call(args, kwargs)
    except PayloadError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return Schedule(
        cron=schedule.cron,
        tz=schedule.tz,
        args=tuple(args),
        kwargs=kwargs,
        name=name,
        overlap=schedule.overlap,
        pass_tick=schedule.pass_tick,
        max_lateness=schedule.max_lateness,
    )
