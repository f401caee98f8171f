"""Parsing of ``DEBOUNCE_QUEUES``: per-queue CoDel settings (§6; split from :mod:`django_debounce.conf`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .durations import parse_duration


@dataclass(frozen=True)
class CodelSettings:
    """One queue's CoDel parameters (§6, §11; RFC 8289 §4 ``TARGET``/``INTERVAL``).

    Attributes:
        target: the acceptable standing wait of a job, from its ``run_at`` to
            its claim (RFC ``TARGET``).
        interval: how long the wait must stay above ``target`` before the
            queue starts shedding, and the base of the drop spacing
            ``interval / sqrt(count)`` (RFC ``INTERVAL``). Longer than ``target``.
    """

    target: timedelta
    interval: timedelta


#: Keys a ``DEBOUNCE_QUEUES`` entry may hold, and keys of its ``"codel"`` dict.
QUEUE_KEYS = ("codel",)
CODEL_KEYS = ("target", "interval")


def parse_queues(value: Any) -> dict[str, CodelSettings]:
    """Validate ``DEBOUNCE_QUEUES`` and return the CoDel settings of each queue that has them.

    Args:
        value: the setting, e.g. ``{"default": {"codel": {"target": "500ms",
            "interval": "5s"}}}``: queue name -> options dict. The only option is
            ``"codel"``: a dict with the durations ``"target"`` and ``"interval"``
            (both required), or ``None`` for off. ``None`` for the whole setting
            means no per-queue options.

    Returns:
        Queue name -> :class:`CodelSettings`, for queues with CoDel on only.

    Raises:
        ConfigurationError: the setting is not a dict of dicts; a queue name is
            not a non-empty string; an unknown option key; ``"codel"`` is not a
            dict, misses ``target``/``interval`` or has other keys; a duration is
            invalid or not positive; ``target`` is not shorter than ``interval``.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"DEBOUNCE_QUEUES={value!r} must be a dict of queue name -> options, e.g. "
            '{"default": {"codel": {"target": "500ms", "interval": "5s"}}}.'
        )
    result: dict[str, CodelSettings] = {}
    for queue, options in value.items():
        where = f"DEBOUNCE_QUEUES[{queue!r}]"
        if not isinstance(queue, str) or not queue or len(queue) > 100:
            raise ConfigurationError(
                f"{where}: a queue name must be a non-empty str of at most 100 characters."
            )
        if not isinstance(options, Mapping):
            raise ConfigurationError(
                f'{where}={options!r} must be a dict of options, e.g. {{"codel": {{...}}}}.'
            )
        unknown = sorted(str(key) for key in options if key not in QUEUE_KEYS)
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown option(s) {unknown}; accepted: {', '.join(QUEUE_KEYS)}."
            )
        codel = options.get("codel")
        if codel is None:
            continue
        if not isinstance(codel, Mapping):
            raise ConfigurationError(
                f'{where}["codel"]={codel!r} must be a dict like '
                '{"target": "500ms", "interval": "5s"}, or None for off.'
            )
        unknown = sorted(str(key) for key in codel if key not in CODEL_KEYS)
        missing = [key for key in CODEL_KEYS if key not in codel]
        if unknown or missing:
            raise ConfigurationError(
                f'{where}["codel"] needs exactly the keys target and interval '
                f"(missing: {missing or 'none'}; unknown: {unknown or 'none'})."
            )
        target = parse_duration(codel["target"], name=f'{where}["codel"]["target"]')
        interval = parse_duration(codel["interval"], name=f'{where}["codel"]["interval"]')
        if target >= interval:
            raise ConfigurationError(
                f'{where}["codel"]: target ({target}) must be shorter than interval ({interval}); '
                "RFC 8289 suggests a target of 5–10% of the interval."
            )
        result[queue] = CodelSettings(target=target, interval=interval)
    return result
