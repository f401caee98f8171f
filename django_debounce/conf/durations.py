"""Parse the durations the contract accepts (§2).

A duration is an ``int``/``float`` number of seconds, a :class:`~datetime.timedelta`,
or a string of one or more ``<number><unit>`` parts with units ``ms``, ``s``,
``m``, ``h``, ``d`` (e.g. ``"250ms"``, ``"10s"``, ``"1h30m"``), its numbers in the
ASCII digits ``0-9``; surrounding spaces and upper-case units are accepted.
"""

from __future__ import annotations

import re
from datetime import timedelta

from ..exceptions import ConfigurationError

DurationLike = int | float | timedelta | str

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: ``[0-9]``, not ``\d``: ``\d`` and ``float()`` read any Unicode decimal digit, so
#: ``"١٠s"`` (Arabic-Indic digits) was 10 s (decision 166).
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")

#: The longest duration accepted: 100 years. Every duration is added to ``now`` somewhere
#: (a deadline, an expiry, a breaker's reset, a backoff); a longer one is a typo, and one
#: past ``datetime.max`` would raise ``OverflowError`` at enqueue or, worse, in every claim.
MAX_DURATION = timedelta(days=36_500)


def parse_duration(value: DurationLike, *, name: str = "duration") -> timedelta:
    """Return ``value`` as a strictly positive :class:`~datetime.timedelta`.

    Args:
        value: seconds (``int``/``float``), a ``timedelta``, or a string such
            as ``"250ms"``, ``"10s"``, ``"5m"``, ``"2h"``, ``"1d"``, ``"1h30m"``.
        name: the option's name, used in the error message.

    Raises:
        ConfigurationError: the value is zero, negative, not finite, longer than
            :data:`MAX_DURATION` (100 years), of another type, or a string that is
            not a sequence of ``<number><unit>`` parts (numbers in ASCII digits).
    """
    try:
        result = _parse(value, name)
    except OverflowError:  # reported below as too long (or as not positive)
        negative = isinstance(value, int | float) and value < 0
        result = -MAX_DURATION if negative else MAX_DURATION * 2
    if result <= timedelta(0):
        raise ConfigurationError(f"{name}={value!r} must be longer than zero.")
    if result > MAX_DURATION:
        raise ConfigurationError(
            f"{name}={value!r} is longer than the 100 years (36500d) a duration may last; "
            "check the unit (e.g. '10s', not '10d')."
        )
    return result


def _parse(value: DurationLike, name: str) -> timedelta:
    """Return ``value`` as a ``timedelta`` of any sign (``OverflowError`` when out of range)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r} is not a duration; give seconds or '10s'.")
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigurationError(f"{name}={value!r} is not a finite number of seconds.")
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        text = value.strip().lower()
        pos = 0
        seconds = 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not text or pos != len(text):
            if any(char.isdigit() and not char.isascii() for char in text):
                raise ConfigurationError(
                    f"{name}={value!r} is not a duration: write its numbers with the ASCII "
                    "digits 0-9, e.g. '10s' or '1h30m'."
                )
            raise ConfigurationError(
                f"{name}={value!r} is not a duration. Use seconds (10, 2.5), a timedelta, "
                "or a string like '250ms', '10s', '5m', '2h', '1d' or '1h30m'."
            )
        result = timedelta(seconds=seconds)
    else:
        raise ConfigurationError(
            f"{name}={value!r} has type {type(value).__name__}; give seconds, a timedelta "
            "or a string like '5m'."
        )
    return result
