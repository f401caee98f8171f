"""The parsed ``DEBOUNCE_PRUNE`` setting: the worker's automatic prune (issue #11, item 3).

A leaf beside :mod:`django_debounce.conf`, which reads the setting and parses
it with :func:`parse_prune`; check E045 reports a malformed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .durations import parse_duration

#: Values of the keys left out of ``DEBOUNCE_PRUNE`` (decision 112).
PRUNE_DEFAULTS: dict[str, Any] = {
    "older_than": "7d",
    "every": "1h",
    "batch_size": 1000,
    "dead_letters": False,
}


@dataclass(frozen=True)
class Prune:
    """The parsed ``DEBOUNCE_PRUNE`` setting.

    Attributes:
        older_than: finished jobs whose ``finished_at`` is at least this old are deleted.
        every: how often a worker prunes (at its start, then at most once per ``every``).
        batch_size: rows per transaction (>= 1).
        dead_letters: also delete dead letters older than ``older_than``.
    """

    older_than: timedelta
    every: timedelta
    batch_size: int
    dead_letters: bool


def parse_prune(value: Any) -> Prune | None:
    """Parse ``DEBOUNCE_PRUNE``.

    Args:
        value: ``None`` (no automatic prune, the default), or a dict with any of
            the keys ``older_than`` and ``every`` (durations, §2),
            ``batch_size`` (int >= 1) and ``dead_letters`` (bool); a key left
            out takes its value from :data:`PRUNE_DEFAULTS`
            (``{"older_than": "7d", "every": "1h", "batch_size": 1000, "dead_letters": False}``).

    Returns:
        The parsed setting, or ``None`` when the automatic prune is off.

    Raises:
        ConfigurationError: not a dict, an unknown key, a duration that does not
            parse, ``batch_size`` not an int >= 1, or ``dead_letters`` not a bool.
    """
    name = "DEBOUNCE_PRUNE"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{name}={value!r} must be None (off) or a dict such as "
            '{"older_than": "7d", "every": "1h"}.'
        )
    unknown = sorted(set(value) - set(PRUNE_DEFAULTS), key=str)
    if unknown:
        raise ConfigurationError(
            f"{name} has unknown key(s) {unknown}; the keys are older_than, every, "
            "batch_size and dead_letters."
        )
    merged = {**PRUNE_DEFAULTS, **value}
    size = merged["batch_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigurationError(f'{name}["batch_size"]={size!r} must be an int >= 1.')
    if not isinstance(merged["dead_letters"], bool):
        raise ConfigurationError(
            f'{name}["dead_letters"]={merged["dead_letters"]!r} must be True or False.'
        )
    return Prune(
        older_than=parse_duration(merged["older_than"], name=f'{name}["older_than"]'),
        every=parse_duration(merged["every"], name=f'{name}["every"]'),
        batch_size=size,
        dead_letters=merged["dead_letters"],
    )
