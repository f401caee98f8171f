"""Parsing of the plain scalar settings and options: seconds, counts, a flag (decisions 162, 163).

A leaf: the settings table (:mod:`django_debounce.conf.table`) reads
``DEBOUNCE_POLL_INTERVAL``, ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``,
``DEBOUNCE_PREFETCH``, ``DEBOUNCE_MAX_RETRIES``, ``DEBOUNCE_ENQUEUE_RETRIES``,
``DEBOUNCE_MAX_PAYLOAD_BYTES`` and ``DEBOUNCE_BACKOFF_JITTER`` through these
parsers, the settings check reports what they raise (E009, E010, E014, E015,
E016, E055, E056), and :mod:`django_debounce.options` checks a task's
``max_retries`` with the same rule, so what ``manage.py check`` passes is what
the worker and every enqueue accept. Durations have their own parser
(:func:`django_debounce.conf.durations.parse_duration`).
"""

from __future__ import annotations

import math
from typing import Any, Final

from ..exceptions import ConfigurationError

#: The most retries a job may have (``max_retries``; ``DEBOUNCE_MAX_RETRIES``): the
#: backoff's doubling stays within ``timedelta`` (retry.py) and a job's attempts
#: within ``Job.max_retries``.
MAX_RETRIES_LIMIT: Final = 10_000

#: The longest ``DEBOUNCE_POLL_INTERVAL`` (and ``--poll-interval``): one day. An idle worker
#: sleeps at most this long, in ``Event.wait`` (which refuses more than about 292 years)
#: and as a ``timedelta`` (``idle_timeout``); a longer sleep is no backstop.
MAX_POLL_INTERVAL: Final = 86_400.0

#: The longest ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``, in seconds (decision 122).
MAX_FLUSH_INTERVAL: Final = 60.0

#: The smallest ``DEBOUNCE_MAX_PAYLOAD_BYTES`` accepted (check E014): 1 KiB.
MIN_PAYLOAD_BYTES: Final = 1024


def parse_seconds(
    value: Any, *, name: str, low: float, high: float, low_open: bool = False
) -> float:
    """Return ``value``, a finite number of seconds from ``low`` to ``high``, as a ``float``.

    Args:
        value: the setting or option, an ``int`` or ``float``.
        name: the name put in the message (``"DEBOUNCE_POLL_INTERVAL"``).
        low, high: the bounds, both included unless ``low_open`` (then the
            value must be greater than ``low``).

    Raises:
        ConfigurationError: a ``bool``, a string or another type, NaN, an
            infinity, or a value out of range.
    """
    ok = False
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = math.inf
        above = number > low if low_open else number >= low
        ok = math.isfinite(number) and above and number <= high
    if not ok:
        raise ConfigurationError(f"{name}={value!r} must be {seconds_range(low, high, low_open)}.")
    return number


def seconds_range(low: float, high: float, low_open: bool = False) -> str:
    """Return the words for a range of seconds: ``"a finite number of seconds from 0 to 60"``."""
    start = f"greater than {low:g} and at most" if low_open else f"from {low:g} to"
    day = " (one day)" if high == MAX_POLL_INTERVAL else ""
    return f"a finite number of seconds {start} {high:g}{day}"


def parse_count(value: Any, *, name: str, low: int, high: int | None = None) -> int:
    """Return ``value``, an ``int`` from ``low`` to ``high`` (no upper bound when ``None``).

    Args:
        value: the setting or option.
        name: the name put in the message (``"DEBOUNCE_MAX_RETRIES"`` or
            ``"enqueue of 'T': max_retries"``).
        low, high: the bounds, both included.

    Raises:
        ConfigurationError: a ``bool``, a ``float``, a string or another type,
            or an ``int`` out of range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        shape = f"an int from {low} to {high}" if high is not None else f"an int >= {low}"
        raise ConfigurationError(f"{name}={value!r} must be {shape}.")
    return value


def parse_max_retries(value: Any, *, name: str = "DEBOUNCE_MAX_RETRIES") -> int:
    """Return ``value`` if it is a valid ``max_retries``: an ``int`` from 0 to 10,000.

    One rule for the setting (check E009, ``settings.max_retries``) and for a
    task's or call's ``max_retries=`` (:mod:`django_debounce.options`).

    Raises:
        ConfigurationError: anything else, naming ``name``.
    """
    return parse_count(value, name=name, low=0, high=MAX_RETRIES_LIMIT)


def parse_poll_interval(value: Any, *, name: str = "DEBOUNCE_POLL_INTERVAL") -> float:
    """Return ``value``, seconds greater than 0 and at most one day (check E010).

    Raises:
        ConfigurationError: not a finite ``int``/``float`` in that range.
    """
    return parse_seconds(value, name=name, low=0.0, high=MAX_POLL_INTERVAL, low_open=True)


def parse_flush_interval(value: Any) -> float:
    """Return ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``: finite seconds from 0 to 60 (check E056).

    Raises:
        ConfigurationError: not a finite ``int``/``float`` in that range.
    """
    return parse_seconds(
        value, name="DEBOUNCE_SUCCESS_FLUSH_INTERVAL", low=0.0, high=MAX_FLUSH_INTERVAL
    )


def parse_prefetch(value: Any) -> int:
    """Return ``DEBOUNCE_PREFETCH``: an ``int`` >= 0 (check E055).

    Raises:
        ConfigurationError: anything else.
    """
    return parse_count(value, name="DEBOUNCE_PREFETCH", low=0)


def parse_enqueue_retries(value: Any) -> int:
    """Return ``DEBOUNCE_ENQUEUE_RETRIES``: any ``int``; values below 1 count as 1 (check E015).

    Raises:
        ConfigurationError: not an ``int`` (a ``bool``, a ``float``, a string, ``None``).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"DEBOUNCE_ENQUEUE_RETRIES={value!r} is not an integer.")
    return value


def parse_max_payload_bytes(value: Any) -> int:
    """Validate ``DEBOUNCE_MAX_PAYLOAD_BYTES`` and return it (check E014).

    Args:
        value: the setting, an ``int`` number of bytes, at least
            :data:`MIN_PAYLOAD_BYTES` (1024).

    Raises:
        ConfigurationError: not an ``int`` (a ``bool`` or a string counts as
            wrong), or below 1024.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_PAYLOAD_BYTES:
        raise ConfigurationError(
            f"DEBOUNCE_MAX_PAYLOAD_BYTES={value!r} must be an int of at least "
            f"{MIN_PAYLOAD_BYTES} (bytes of JSON text), e.g. 1048576 for 1 MiB."
        )
    return value


def parse_backoff_jitter(value: Any) -> bool:
    """Return ``DEBOUNCE_BACKOFF_JITTER``: ``True`` or ``False`` itself (check E016).

    The worker reads the setting through this parser too, so ``1`` or
    ``"False"``, which the check refuses, is not taken as a truth value at run time.

    Raises:
        ConfigurationError: anything but a ``bool``.
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"DEBOUNCE_BACKOFF_JITTER={value!r} is not True or False.")
    return value


__all__ = [
    "MAX_FLUSH_INTERVAL",
    "MAX_POLL_INTERVAL",
    "MAX_RETRIES_LIMIT",
    "MIN_PAYLOAD_BYTES",
    "parse_backoff_jitter",
    "parse_count",
    "parse_enqueue_retries",
    "parse_flush_interval",
    "parse_max_payload_bytes",
    "parse_max_retries",
    "parse_poll_interval",
    "parse_prefetch",
    "parse_seconds",
]
