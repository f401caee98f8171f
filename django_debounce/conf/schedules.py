"""Parsing of ``DEBOUNCE_SCHEDULES``: periodic schedules declared in settings (decision 209).

The setting's shape is checked here, at its first read (the settings table's
row, check ``E047``); what needs the task it names (its signature, its key
templates, the cron parser, the time zone) is checked once the tasks are
registered, by :func:`django_debounce.settings_schedules.settings_schedules`
(check ``E048``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ConfigurationError

#: Keys a ``DEBOUNCE_SCHEDULES`` entry may hold (``task`` and ``cron`` are required).
SCHEDULE_KEYS = ("task", "cron", "tz", "args", "kwargs", "overlap", "pass_tick", "max_lateness")

#: The longest schedule name (``PeriodicTick.schedule``; ``schedules.MAX_NAME_LENGTH``).
MAX_NAME_LENGTH = 200


@dataclass(frozen=True)
class ScheduleSetting:
    """One entry of ``DEBOUNCE_SCHEDULES``, its shape checked (the task it names is not).

    Attributes:
        name: the schedule's name (the entry's key): unique in the deployment,
            1 to 200 characters; its ticks are recorded under it.
        task: the registered name of the task it runs (``Job.task_name``).
        cron, tz, args, kwargs, overlap, pass_tick, max_lateness: as the
            arguments of :class:`django_debounce.Schedule`.
    """

    name: str
    task: str
    cron: str
    tz: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    overlap: bool = False
    pass_tick: bool = False
    max_lateness: Any = None


def parse_schedules(value: Any) -> tuple[ScheduleSetting, ...]:
    """Validate the shape of ``DEBOUNCE_SCHEDULES`` and return its entries, by name.

    Args:
        value: the setting: schedule name -> a dict with ``"task"`` (the task's
            registered name) and ``"cron"`` (a cron expression), and optionally
            ``"tz"`` (an IANA zone name), ``"args"`` (a list or tuple),
            ``"kwargs"`` (a dict with str keys), ``"overlap"`` and
            ``"pass_tick"`` (bools) and ``"max_lateness"`` (a duration), e.g.
            ``{"nightly-report": {"task": "reports.tasks.build_report",
            "cron": "0 3 * * *", "tz": "Europe/Paris", "args": ["daily"]}}``.
            ``None`` or ``{}``: no schedule in settings.

    Returns:
        The entries sorted by name, as :class:`ScheduleSetting`.

    Raises:
        ConfigurationError: the setting is not a dict; a name is not text of 1
            to 200 characters; an entry is not a dict, lacks ``task`` or
            ``cron``, has an unknown key, or a value of the wrong type. The
            message names each wrong entry and its key, all of them at once.
    """
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"DEBOUNCE_SCHEDULES={value!r} must be a dict of schedule name -> schedule, e.g. "
            '{"nightly-report": {"task": "reports.tasks.build_report", "cron": "0 3 * * *"}}.'
        )
    found: list[ScheduleSetting] = []
    wrong: list[str] = []
    for name, entry in value.items():
        try:
            found.append(_entry(name, entry))
        except ConfigurationError as exc:
            wrong.append(str(exc))
    if wrong:  # every entry's error at once: a reader fixes them in one pass
        raise ConfigurationError(" ".join(wrong))
    return tuple(sorted(found, key=lambda s: s.name))


def _storable(text: str) -> bool:
    """As :func:`django_debounce.codec.is_storable_text` (``conf`` imports nothing above it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _entry(name: object, entry: object) -> ScheduleSetting:
    where = f"DEBOUNCE_SCHEDULES[{name!r}]"
    if not isinstance(name, str) or not 0 < len(name.strip()) <= MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{where}: a schedule name must be text of 1 to {MAX_NAME_LENGTH} characters."
        )
    if not _storable(name):
        raise ConfigurationError(
            f"{where}: a schedule name may not hold a NUL character or a lone surrogate "
            "(no supported database can store it)."
        )
    if not isinstance(entry, Mapping):
        raise ConfigurationError(
            f'{where}={entry!r} must be a dict such as {{"task": "app.tasks.fn", '
            '"cron": "*/5 * * * *"}.'
        )
    unknown = sorted(str(key) for key in entry if key not in SCHEDULE_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown key(s) {unknown}; accepted: {', '.join(SCHEDULE_KEYS)}."
        )
    for required in ("task", "cron"):
        if not isinstance(entry.get(required), str) or not entry[required].strip():
            raise ConfigurationError(
                f"{where}: {required!r} is required and must be a non-empty str"
                + (
                    " (the task's registered name, e.g. 'reports.tasks.build_report')."
                    if required == "task"
                    else " (a cron expression, e.g. '*/5 * * * *')."
                )
            )
    tz = entry.get("tz")
    if tz is not None and (not isinstance(tz, str) or not tz.strip()):
        raise ConfigurationError(
            f"{where}: 'tz' must be an IANA zone name such as 'Europe/Paris', or None "
            f"(settings.TIME_ZONE); got {tz!r}."
        )
    args = entry.get("args", ())
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ConfigurationError(f"{where}: 'args' must be a list or tuple, got {args!r}.")
    kwargs = entry.get("kwargs", {})
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigurationError(f"{where}: 'kwargs' must be a dict with str keys, got {kwargs!r}.")
    for flag in ("overlap", "pass_tick"):
        if not isinstance(entry.get(flag, False), bool):
            raise ConfigurationError(f"{where}: {flag!r} takes True or False, got {entry[flag]!r}.")
    return ScheduleSetting(
        name=name,
        task=entry["task"],
        cron=entry["cron"],
        tz=tz,
        args=tuple(args),
        kwargs=dict(kwargs),
        overlap=entry.get("overlap", False),
        pass_tick=entry.get("pass_tick", False),
        max_lateness=entry.get("max_lateness"),
    )


__all__ = ["SCHEDULE_KEYS", "ScheduleSetting", "parse_schedules"]
