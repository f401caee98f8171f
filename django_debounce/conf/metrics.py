"""Parsing of the metrics settings (``DEBOUNCE_METRICS*``; docs/howto/metrics.md, issue #11)."""

from __future__ import annotations

import math
from typing import Any

from ..exceptions import ConfigurationError


def parse_metrics_enabled(value: Any) -> bool | None:
    """Validate ``DEBOUNCE_METRICS``: ``None`` (on when prometheus_client imports), True or False.

    Raises:
        ConfigurationError: anything else (check E040).
    """
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(
            f"DEBOUNCE_METRICS={value!r} must be None (metrics on when prometheus_client is "
            "installed), True (on; the extra django-debounce[prometheus] is required) or False."
        )
    return value


def parse_buckets(value: Any, *, name: str) -> tuple[float, ...]:
    """Validate a histogram's bucket bounds: a non-empty sequence of increasing positive seconds.

    Args:
        value: e.g. ``(0.5, 1, 5)``; ``+Inf`` is added by prometheus_client.
        name: the setting's name, for the message.

    Raises:
        ConfigurationError: not a list/tuple of numbers, empty, a bound not
            positive and finite (NaN, infinity) or not larger than the one before (check E041).
    """
    ok = isinstance(value, list | tuple) and bool(value)
    bounds: list[float] = []
    if ok:
        for bound in value:
            if (
                isinstance(bound, bool)
                or not isinstance(bound, int | float)
                or not 0 < bound < math.inf  # NaN and infinity fail (decision 162)
            ):
                ok = False
                break
            if bounds and bound <= bounds[-1]:
                ok = False
                break
            bounds.append(float(bound))
    if not ok:
        raise ConfigurationError(
            f"{name}={value!r} must be a non-empty list of increasing, finite, positive numbers of "
            "seconds, e.g. [1, 5, 30, 60, 300]."
        )
    return tuple(bounds)
