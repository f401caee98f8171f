"""Parse rate limits such as ``"10/s"`` or ``"5/10s"`` (contract §6, §11)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .conf.durations import parse_duration
from .exceptions import ConfigurationError

#: ``[0-9]``, not ``\d`` (which takes any Unicode digit: ``"١٠/s"``), as in durations.
_RATE = re.compile(r"^\s*([0-9]+)\s*/\s*(\S+)\s*$")
_PERIODS = {"s": "1s", "m": "1m", "h": "1h", "d": "1d"}


@dataclass(frozen=True)
class Rate:
    """A token bucket's rate: ``count`` tokens per ``period_seconds``."""

    count: int
    period_seconds: float


def parse_rate(value: str, *, name: str = "rate_limit") -> Rate:
    """Return the :class:`Rate` of ``"N/period"``.

    ``period`` is ``s``, ``m``, ``h``, ``d`` or a duration such as ``10s``.

    Raises:
        ConfigurationError: the text is not ``"N/period"`` with N ≥ 1 and a
            positive period.
    """
    match = _RATE.match(value) if isinstance(value, str) else None
    if not match or int(match.group(1)) < 1:
        raise ConfigurationError(
            f"{name}={value!r} is not a rate. Write 'N/period' with N >= 1, e.g. '10/s', "
            "'100/m', '5/10s', '1/d'."
        )
    period = _PERIODS.get(match.group(2), match.group(2))
    try:
        seconds = parse_duration(period, name=name).total_seconds()
    except ConfigurationError as exc:
        # Quote the whole rate, not only its period (tester report item 9).
        raise ConfigurationError(
            f"{name}={value!r} is not a rate: its period {match.group(2)!r} is not a valid "
            f"duration ({exc}). Write 'N/period' with period s, m, h, d or a duration such as "
            "'10s', '1h30m' or '14d', e.g. '5/14d'."
        ) from exc
    return Rate(count=int(match.group(1)), period_seconds=seconds)
