"""Per-key token buckets in Redis (``rate_limit_per_key=`` with ``DEBOUNCE_REDIS``; decisions 193-194).

With ``DEBOUNCE_REDIS`` set, the bucket of each (task, debounce key hash) of a
task with ``rate_limit_per_key=`` is a Redis hash beside the task-wide ones
(:mod:`django_debounce.flow.redis_buckets`): the same Lua take and refund, the
same arithmetic, one atomic script per take, so every worker shares one
bucket per key without a database row lock. Its key
(``django_debounce:keybucket:<task>:<key hash>``, under the cache's
``KEY_PREFIX`` and version) expires after the bucket's refill time
(capacity / rate, e.g. 60 s at ``"3/m"``): an expired key reads as a full
bucket, which it is by then, so keys never pile up.

A claim takes a key's token in Redis when it admits the job
(:class:`KeyTokens`), into the claim's :class:`~django_debounce.flow.redis_tokens.TokenLedger`:
a decision taken back, a later rule that refuses the job (the task's own Redis
bucket) and a claim that rolls back give it back (decision 101's rules).

Two things stay in the database, because the claim's candidate query and the
worker's wake-up read them there: a defer-mode key left without a whole token
writes its :class:`~django_debounce.models.KeyBucket` row with
``blocked_until`` (its next token), so waiting keys stay out of the candidate
query as in the database store (decision 189); other keys have no row.

Redis unreachable: as the task-wide buckets (decision 102), claims use the
database buckets for :data:`~django_debounce.flow.redis_buckets.PROBE_INTERVAL`;
a take that fails mid-claim holds the job (never sheds it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from . import redis_buckets
from .redis_buckets import Level, RedisBuckets, RedisUnavailable
from .redis_tokens import TokenLedger
from .throttle import TokenBucket

Pair = tuple[str, str]


def scoped(pair: Pair) -> str:
    """Return the bucket name of a (task name, key hash) pair: ``"<task>:<key hash>"``."""
    return f"{pair[0]}:{pair[1]}"


class RedisKeyBuckets(RedisBuckets):
    """The per-key buckets of one django-redis cache alias (names from :func:`scoped`).

    Args:
        alias: a ``CACHES`` alias served by django-redis.

    A take or refund that Redis does not answer raises
    :class:`~django_debounce.flow.redis_buckets.RedisUnavailable` after
    recording the outage, shared with the task-wide buckets.
    """

    def key(self, task_name: str) -> str:
        """Return the Redis key of the per-key bucket ``task_name`` (``"<task>:<key hash>"``)."""
        from django.core.cache import caches

        return str(caches[self.alias].make_key(f"django_debounce:keybucket:{task_name}"))

    def ttl(self, bucket: TokenBucket) -> int:
        """Return the seconds a key bucket lives after a take: the refill time from empty (≥ 1 s)."""
        return max(1, math.ceil(bucket.capacity / bucket.per_second))


_stores: dict[str, RedisKeyBuckets] = {}


def key_store() -> RedisKeyBuckets | None:
    """Return the Redis store of per-key buckets to use now, or ``None`` for the database.

    ``None`` exactly when :func:`~django_debounce.flow.redis_buckets.store` is
    (``DEBOUNCE_REDIS`` unset, or Redis failed within the probe interval).
    """
    shared = redis_buckets.store()
    if shared is None:
        return None
    found = _stores.get(shared.alias)
    if found is None:
        found = _stores[shared.alias] = RedisKeyBuckets(shared.alias)
    return found


def read_level(task_name: str, key_hash: str) -> Level | None:
    """Return a key's Redis level (``Level(None, None)``: full), or ``None`` when Redis is off or down."""
    where = key_store()
    if where is None:
        return None
    name = scoped((task_name, key_hash))
    try:
        return where.levels({name: TokenBucket(1, 1.0, "")})[name]
    except RedisUnavailable:
        return None


class KeyTokens:
    """The Redis side of one claim's per-key buckets (used by :class:`~django_debounce.flow.key_rates.KeyRows`).

    Args:
        where: the store (:func:`key_store`).
        ledger: the claim's ledger, shared with the task-wide takes.

    ``levels`` holds each pair's level as this claim sees it (Redis's answer,
    then this claim's takes); ``failed`` the pairs Redis failed for (held,
    never shed, for the rest of the claim); ``taken`` the pairs whose token
    the job being judged took (for :meth:`give_back`).
    """

    def __init__(self, where: RedisKeyBuckets, ledger: TokenLedger) -> None:
        self.where = where
        self.ledger = ledger
        self.levels: dict[Pair, Level] = {}
        self.failed: set[Pair] = set()
        self.taken: set[Pair] = set()

    def read(self, pairs: Iterable[Pair]) -> bool:
        """Read the levels of ``pairs`` not read yet (one round trip); False if Redis failed.

        After a failure the pairs are in :attr:`failed` (held, never shed).
        """
        wanted = sorted(set(pairs) - set(self.levels) - self.failed)
        if not wanted:
            return True
        names = {scoped(pair): TokenBucket(1, 1.0, "") for pair in wanted}
        try:
            found = self.where.levels(names)
        except RedisUnavailable:
            self.failed.update(wanted)
            return False
        self.levels.update({pair: found[scoped(pair)] for pair in wanted})
        return True

    def take(self, pair: Pair, bucket: TokenBucket, now: datetime) -> str:
        """Take one token of ``pair``'s bucket at ``now``: ``"admit"``, ``"refused"`` or ``"failed"``."""
        try:
            took = self.ledger.take(self.where, scoped(pair), bucket, now)
        except RedisUnavailable:
            self.failed.add(pair)
            return "failed"
        self.levels[pair] = took.level
        if not took.granted:
            return "refused"
        self.taken.add(pair)
        return "admit"

    def give_back(self, pair: Pair, bucket: TokenBucket) -> None:
        """Give back the token ``pair``'s job took (a later rule refused it)."""
        if pair in self.taken:
            self.taken.discard(pair)
            self.ledger.give_back(self.where, scoped(pair), bucket, 1)
            level = self.levels.get(pair)
            if level is not None and level.tokens is not None:
                tokens = min(float(bucket.capacity), level.tokens + 1)
                self.levels[pair] = Level(tokens, level.tokens_at)

    def mark(self) -> tuple[Any, ...]:
        """Return the in-memory state (the ledger is marked by the task-wide side)."""
        return dict(self.levels), set(self.failed), set(self.taken)

    def restore(self, mark: tuple[Any, ...]) -> None:
        """Restore the state of :meth:`mark` (the tokens go back through the shared ledger)."""
        self.levels, self.failed, self.taken = dict(mark[0]), set(mark[1]), set(mark[2])


__all__ = ["KeyTokens", "RedisKeyBuckets", "key_store", "read_level", "scoped"]
