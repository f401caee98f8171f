"""Parsing of ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` (§8, §11; split from :mod:`django_debounce.conf`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .durations import parse_duration


@dataclass(frozen=True)
class AutoRetry:
    """The parsed ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` setting (§8, §11).

    Attributes:
        every: how often a worker runs the sweep (at most once per ``every``,
            plus once at the start of every ``--burst``).
        min_age: an entry is retried once it is at least this old
            (``created_at <= now - min_age``).
        max_retries: how many automatic retries one job's chain of retries
            gets: an entry is retried while its ``retry_depth`` is below it.
    """

    every: timedelta
    min_age: timedelta
    max_retries: int


#: Values of the keys left out of ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` (the contract's example, §11).
AUTO_RETRY_DEFAULTS: dict[str, Any] = {"every": "10m", "min_age": "10m", "max_retries": 3}


def parse_auto_retry(value: Any) -> AutoRetry | None:
    """Parse ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` (§11).

    Args:
        value: ``None`` (the sweep is off), or a dict with any of the keys
            ``every`` and ``min_age`` (durations, §2) and ``max_retries``
            (int >= 1); a key left out takes its value from
            ``{"every": "10m", "min_age": "10m", "max_retries": 3}``.

    Returns:
        The parsed setting, or ``None`` when the sweep is off.

    Raises:
        ConfigurationError: not a dict, an unknown key, a duration that does
            not parse or is not positive, or ``max_retries`` not an int >= 1.
    """
    name = "DEBOUNCE_DEAD_LETTER_AUTO_RETRY"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{name}={value!r} must be None (off) or a dict such as "
            '{"every": "10m", "min_age": "10m", "max_retries": 3}.'
        )
    unknown = sorted(set(value) - set(AUTO_RETRY_DEFAULTS), key=str)
    if unknown:
        raise ConfigurationError(
            f"{name} has unknown key(s) {unknown}; the keys are every, min_age and max_retries."
        )
    merged = {**AUTO_RETRY_DEFAULTS, **value}
    retries = merged["max_retries"]
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ConfigurationError(
            f'{name}["max_retries"]={retries!r} must be an int >= 1 (automatic retries along '
            "one job's chain); set the whole setting to None to turn the sweep off."
        )
    return AutoRetry(
        every=parse_duration(merged["every"], name=f'{name}["every"]'),
        min_age=parse_duration(merged["min_age"], name=f'{name}["min_age"]'),
        max_retries=retries,
    )
