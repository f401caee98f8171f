"""The Redis tokens one claim takes, and how they go back (issue #10 item 2; decision 101).

A claim with ``DEBOUNCE_REDIS`` set takes a token in Redis when it admits a
job (:class:`ClaimTokens`, used by :class:`~django_debounce.flow.admission.Admission`),
inside its database transaction, and records each take in a
:class:`TokenLedger`. Takes of decisions the claim takes back (a job another
worker locked first) are given back at once; the claim gives back every take
when its transaction rolls back. Why take before the commit rather than after:
a take refused after the commit would leave a claimed job without a token, and
the rate would be exceeded; taking first errs the other way: a process killed
between the take and its rollback leaves that claim's tokens spent, so the
bucket runs fewer jobs for a moment, never more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .redis_buckets import Level, RedisBuckets, RedisUnavailable, Take, store
from .throttle import TokenBucket

logger = logging.getLogger("django_debounce.redis")


@dataclass
class TokenLedger:
    """The tokens one claim transaction took from Redis, to give back if it does not keep them.

    :meth:`take` records each take; :meth:`mark` and :meth:`refund_since`
    give back the takes of decisions the claim took back; :meth:`refund_all`
    gives back every take of a claim that rolled back (decision 101).
    """

    takes: list[tuple[RedisBuckets, str, TokenBucket, int]] = field(default_factory=list)

    def __enter__(self) -> TokenLedger:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Give every take back when the block (the claim's transaction) raised."""
        if exc_type is not None:
            self.refund_all()

    def take(
        self,
        where: RedisBuckets,
        task_name: str,
        bucket: TokenBucket,
        now: datetime,
        count: int = 1,
    ) -> Take:
        """Take up to ``count`` tokens from ``where`` and remember them (:meth:`.RedisBuckets.take`)."""
        took = where.take(task_name, bucket, now, count)
        if took.granted:
            self.takes.append((where, task_name, bucket, took.granted))
        return took

    def give_back(
        self, where: RedisBuckets, task_name: str, bucket: TokenBucket, count: int
    ) -> None:
        """Give ``count`` tokens taken but not used back now (the claim keeps the rest)."""
        try:
            where.refund(task_name, bucket, count)
        except RedisUnavailable:
            _lost(task_name, count)
            return
        self.takes.append((where, task_name, bucket, -count))

    def mark(self) -> int:
        """Return a position for :meth:`refund_since`."""
        return len(self.takes)

    def refund_since(self, mark: int) -> None:
        """Give back every take recorded after ``mark``; a failed refund is logged, not raised.

        A token that cannot be given back (Redis went away) stays spent: the
        bucket errs towards fewer runs.
        """
        returned = self.takes[mark:]
        del self.takes[mark:]
        totals: dict[tuple[int, str], tuple[RedisBuckets, TokenBucket, int]] = {}
        for where, name, bucket, count in returned:
            _, _, seen = totals.get((id(where), name), (where, bucket, 0))
            totals[(id(where), name)] = (where, bucket, seen + count)
        for (_, name), (where, bucket, count) in totals.items():
            if count <= 0:
                continue
            try:
                where.refund(name, bucket, count)
            except RedisUnavailable:
                _lost(name, count)

    def refund_all(self) -> None:
        """Give back every take recorded (the claim rolled back)."""
        self.refund_since(0)


def _lost(task_name: str, count: int) -> None:
    logger.info(
        "%d token(s) of %s could not be given back to Redis; they stay spent",
        count,
        task_name,
        extra={"action": "redis_refund_lost"},
    )


class ClaimTokens:
    """The Redis side of one claim's admission (:class:`~django_debounce.flow.admission.Admission`).

    Args:
        ledger: the claim's ledger (the claim gives its takes back on rollback).
        buckets: task name -> bucket, for every rate-limited task the claim may admit.

    ``names`` is the set of task names whose tokens are in Redis for this
    claim: empty when ``DEBOUNCE_REDIS`` is off or Redis failed lately
    (:func:`store`), or after :meth:`read_levels` found Redis failing.

    A take asks for as many tokens as the claim may still admit of that task
    (one script call), keeps the extra as credit for the task's next admitted
    jobs, and :meth:`settle` gives back the credit left before the claim commits.
    """

    def __init__(self, ledger: TokenLedger, buckets: Mapping[str, TokenBucket]) -> None:
        self.ledger = ledger
        self.buckets = dict(buckets)
        self.store = store() if buckets else None
        self.names: set[str] = set(buckets) if self.store is not None else set()
        self.levels: dict[str, Level] = {}
        self.failed: set[str] = set()
        #: Names whose take Redis refused in this claim (no whole token at the claim's instant).
        self.refused: set[str] = set()
        #: Tokens taken ahead and not used yet, by name.
        self.credit: dict[str, int] = {}

    def read_levels(self) -> None:
        """Read every bucket's level (one round trip); Redis failing: leave Redis out of this claim.

        Call it before anything is taken (nothing is then lost by leaving Redis out).
        """
        if self.store is None:
            return
        try:
            self.levels = self.store.levels(self.buckets)
        except RedisUnavailable:
            self.store, self.names = None, set()

    def take(self, name: str, now: datetime, want: int = 1) -> bool:
        """Use one token of ``name``'s bucket at ``now``; False when none is left or Redis failed.

        From the credit if there is some; else one script call takes up to
        ``want`` (≥ 1) tokens and keeps all but one as credit. After a failure
        ``name`` is in :attr:`failed`: its jobs are held back (never shed) for
        the rest of this claim.
        """
        if self.credit.get(name, 0) > 0:
            self.credit[name] -= 1
            return True
        assert self.store is not None
        try:
            took = self.ledger.take(self.store, name, self.buckets[name], now, max(1, want))
        except RedisUnavailable:
            self.failed.add(name)
            return False
        self.levels[name] = took.level
        if not took.granted:
            self.refused.add(name)
            return False
        self.credit[name] = took.granted - 1
        return True

    def tokens(self, name: str) -> Level | None:
        """Return ``name``'s level as this claim sees it: Redis's last answer plus its credit."""
        level = self.levels.get(name)
        credit = self.credit.get(name, 0)
        if level is None or level.tokens is None or not credit:
            return level
        return Level(level.tokens + credit, level.tokens_at)

    def settle(self) -> None:
        """Give back the credit left (tokens taken ahead, not used); call it before the commit."""
        for name, left in sorted(self.credit.items()):
            if left > 0 and self.store is not None:
                self.ledger.give_back(self.store, name, self.buckets[name], left)
        self.credit.clear()

    def mark(self) -> tuple[int, dict[str, Level], dict[str, int]]:
        """Return a position for :meth:`restore`."""
        return self.ledger.mark(), dict(self.levels), dict(self.credit)

    def restore(self, mark: tuple[int, dict[str, Level], dict[str, int]]) -> None:
        """Give back the takes made since ``mark`` (decisions taken back); forget refusals."""
        self.ledger.refund_since(mark[0])
        self.levels = dict(mark[1])
        self.credit = dict(mark[2])
        self.refused.clear()


__all__ = ["ClaimTokens", "TokenLedger"]
