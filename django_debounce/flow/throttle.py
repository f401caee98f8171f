"""Token-bucket math for ``rate_limit=`` (contract §6, §11).

A rate ``"N/period"`` is a bucket of capacity ``B`` (``N``, or
``rate_limit_burst=`` when given) refilled continuously at ``N / period``
tokens per second. Claiming one job takes one token; a job finds no token when
the bucket holds less than one. The bucket's level lives in the task's
:class:`~django_debounce.models.TaskState` row (``tokens`` at ``tokens_at``;
``tokens`` NULL means a bucket never used, i.e. full), updated by the claim
transaction under the row's lock, so the rate holds across every worker.

Everything here is pure: functions of ``(tokens, tokens_at, now)``; the clock
is the caller's (``timezone.now()``, §4.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from ..rates import parse_rate

#: Tolerance for float rounding: 5.999999999 tokens after exactly one period count as 6.
EPSILON = 1e-9


@dataclass(frozen=True)
class TokenBucket:
    """A token bucket's shape.

    Attributes:
        capacity: the most tokens the bucket holds (a burst of this many jobs
            may start at once), an int ≥ 1.
        per_second: refill rate in tokens per second (> 0).
        text: the rate as declared, e.g. ``"10/s"`` (for messages).
    """

    capacity: int
    per_second: float
    text: str

    def level(self, tokens: float | None, tokens_at: datetime | None, now: datetime) -> float:
        """Return the bucket's level at ``now``.

        Args:
            tokens: level stored at ``tokens_at``; ``None`` means full (never used).
            tokens_at: when ``tokens`` was stored (aware datetime) or ``None``.
            now: the current instant (aware datetime).

        Returns:
            ``min(capacity, tokens + elapsed_seconds * per_second)``; a clock
            that went backwards adds nothing.
        """
        if tokens is None or tokens_at is None:
            return float(self.capacity)
        elapsed = max(0.0, (now - tokens_at).total_seconds())
        return min(float(self.capacity), tokens + elapsed * self.per_second)

    @staticmethod
    def whole(level: float) -> int:
        """Return how many whole tokens ``level`` holds (rounding noise forgiven)."""
        return max(0, int(level + EPSILON))

    def refill_target(self, free: int) -> int:
        """Return how many whole tokens an idle claimer waits for, with ``free`` threads (≥ 1).

        Enough for its free threads, at most half the capacity (so a claim
        that comes late by up to half the bucket's fill time still finds it not
        yet full and loses no refill), and at least one.
        """
        return max(1, min(free, self.capacity // 2))

    def seconds_until(self, level: float, tokens: int) -> float:
        """Return the seconds a bucket at ``level`` takes to hold ``tokens`` (0 if it does)."""
        return max(0.0, (min(tokens, self.capacity) - level) / self.per_second)

    def take(
        self, tokens: float | None, tokens_at: datetime | None, now: datetime, count: int
    ) -> float:
        """Return the level at ``now`` after taking ``count`` tokens (clamped at 0).

        The caller stores the result as ``tokens`` with ``tokens_at = now``.
        """
        return max(0.0, self.level(tokens, tokens_at, now) - count)


@lru_cache(maxsize=256)
def bucket_for(rate_limit: str, burst: int | None = None) -> TokenBucket:
    """Return the :class:`TokenBucket` of ``rate_limit`` (e.g. ``"10/s"``, ``"5/10s"``).

    Args:
        rate_limit: ``"N/period"`` as accepted by :func:`~django_debounce.rates.parse_rate`.
        burst: capacity override (``rate_limit_burst=``); ``None``: capacity is N.

    Raises:
        ConfigurationError: ``rate_limit`` is not a rate.
    """
    rate = parse_rate(rate_limit)
    capacity = burst if burst is not None else rate.count
    return TokenBucket(
        capacity=capacity, per_second=rate.count / rate.period_seconds, text=rate_limit
    )
