"""Retry delays: exponential backoff with jitter (contract §7).

For the n-th retry (n = 1 after the first failed run) the base delay is
``min(max_backoff, min_backoff * 2 ** (n - 1))``. With jitter on (the default,
"equal jitter" from Brooker, *Exponential Backoff And Jitter*, AWS
Architecture Blog, 2015) the delay is drawn uniformly from
``[base / 2, base]``, so failed jobs do not retry in synchronized waves;
without jitter it is ``base`` exactly.
"""

from __future__ import annotations

import random
from datetime import timedelta


def backoff_window(
    retry: int, min_backoff: timedelta, max_backoff: timedelta
) -> tuple[timedelta, timedelta]:
    """Return the (earliest, latest) delay of retry number ``retry`` (1-based) with jitter.

    The doubling is capped before it is computed, so a task with many retries
    (``max_retries`` up to 10,000) never overflows ``timedelta`` (it would
    raise ``OverflowError`` while the worker records the failed run).
    """
    exponent = min(max(0, retry - 1), 256)  # 2.0 ** 256 times 100 years is still a finite float
    if min_backoff.total_seconds() * 2.0**exponent >= max_backoff.total_seconds():
        base = max_backoff
    else:
        base = min(max_backoff, min_backoff * (2**exponent))
    return base / 2, base


def backoff_delay(
    retry: int, min_backoff: timedelta, max_backoff: timedelta, *, jitter: bool = True
) -> timedelta:
    """Return the delay before retry number ``retry`` (1-based).

    Args:
        retry: 1 for the first retry, 2 for the second, ...
        min_backoff: base delay of the first retry.
        max_backoff: cap on the base delay.
        jitter: draw from ``[base / 2, base]`` instead of returning ``base``.
    """
    low, high = backoff_window(retry, min_backoff, max_backoff)
    if not jitter:
        return high
    return low + (high - low) * random.random()
