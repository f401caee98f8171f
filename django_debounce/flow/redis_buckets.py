"""Rate-limit token buckets in Redis, through django-redis (issue #10 item 2; decisions 100-104).

With ``DEBOUNCE_REDIS = "<cache alias>"`` the token bucket of every task with a
``rate_limit=`` (§6, §11) lives in that Redis instead of the task's
``TaskState`` row: one hash per task name (``tokens`` at ``at``, epoch seconds
of the package's clock, §4.7), changed only by :data:`TAKE_LUA`, one atomic
script per take, so every worker and scheduler of the deployment shares one
bucket without a database row lock. The math is the database bucket's
(:class:`~django_debounce.flow.throttle.TokenBucket`): capacity ``B``, continuous
refill, a take needs a whole token, a clock that went backwards refills nothing
and never moves the stored instant back.

A claim takes a token in Redis when it admits a job, inside its database
transaction, and records the take in a :class:`TokenLedger`; tokens of jobs
the claim then loses (another worker locked them first) and of a claim that
rolls back are given back (:data:`REFUND_LUA`). So a token is spent only for a
job actually claimed, except when the process dies between the take and the
rollback: then the tokens of that claim stay spent, and the bucket errs
towards fewer runs, never more (decision 101).

When Redis cannot be reached the claim falls back to the database bucket:
:func:`store` returns ``None`` for :data:`PROBE_INTERVAL` seconds after a
failure, one warning is logged per outage, and the first call after the
interval probes Redis again (decision 102). Nothing is written to Redis when
``DEBOUNCE_REDIS`` is ``None``, and django-redis is imported only when it is set.

This module sits in the rules layer beside :mod:`django_debounce.flow.throttle`
and imports no model.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from ..conf import settings
from .throttle import TokenBucket

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

logger = logging.getLogger("django_debounce.redis")

#: Seconds after a failed Redis call during which claims use the database bucket
#: without trying Redis; the first claim after it probes Redis again (decision 102).
PROBE_INTERVAL = 5.0

#: Seconds a bucket key outlives the time its bucket takes to refill from empty:
#: an expired key reads as a full bucket, which it is by then (decision 100).
KEY_TTL_MARGIN = 3600

#: Take up to ARGV[4] whole tokens from the bucket KEYS[1] at ARGV[3].
#: ARGV: capacity, tokens per second, now (epoch seconds), wanted, key TTL (s).
#: Returns {granted, level after the take, stored instant} (numbers as strings:
#: Redis would truncate a Lua number to an integer).
TAKE_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local wanted = tonumber(ARGV[4])
local stored = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local level = capacity
local at = ARGV[3]
if stored[1] and stored[2] then
  local then_ = tonumber(stored[2])
  local elapsed = now - then_
  if elapsed < 0 then
    elapsed = 0
    at = stored[2]
  end
  level = math.min(capacity, tonumber(stored[1]) + elapsed * rate)
end
local granted = math.floor(level + 1e-9)
if granted > wanted then granted = wanted end
if granted < 0 then granted = 0 end
if granted > 0 then
  level = math.max(0, level - granted)
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', level), 'at', at)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
end
return {granted, string.format('%.17g', level), at}
"""

#: Give ARGV[2] tokens back to the bucket KEYS[1] (a claim that did not use them).
#: ARGV: capacity, count. Added to the stored level, capped at capacity; a bucket
#: whose key is gone is full already. Returns nothing.
REFUND_LUA = """
local stored = redis.call('HGET', KEYS[1], 'tokens')
if stored then
  local level = math.min(tonumber(ARGV[1]), tonumber(stored) + tonumber(ARGV[2]))
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', level))
end
return 0
"""


class RedisUnavailable(Exception):  # noqa: N818 - an internal signal, never raised to users
    """A Redis call of the bucket store failed; the caller uses the database bucket."""


@dataclass(frozen=True)
class Level:
    """A bucket's stored level, as :class:`~django_debounce.flow.throttle.TokenBucket` reads it.

    Attributes:
        tokens: tokens at ``tokens_at``; ``None``: full (no key, never used or expired).
        tokens_at: the instant ``tokens`` was stored (aware, UTC), or ``None``.
    """

    tokens: float | None
    tokens_at: datetime | None


@dataclass(frozen=True)
class Take:
    """The answer of one take (:meth:`RedisBuckets.take`).

    Attributes:
        granted: whole tokens taken (0 when the bucket held less than one).
        level: the stored level after the take (tokens at ``level.tokens_at``).
    """

    granted: int
    level: Level


def _epoch(now: datetime) -> str:
    """Return ``now`` as epoch seconds, exact to the microsecond (text, for a Lua argument)."""
    return f"{now.timestamp():.6f}"


def _instant(value: bytes | str | None) -> datetime | None:
    """Return the aware UTC instant of stored epoch seconds, or ``None``."""
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def _number(value: bytes | str | int | None) -> float | None:
    return None if value is None else float(value)


class RedisBuckets:
    """The token buckets of one django-redis cache alias.

    Args:
        alias: a ``CACHES`` alias served by django-redis (system checks E036-E039).

    Every method raises :class:`RedisUnavailable` when Redis does not answer
    (any ``redis.exceptions.RedisError``, e.g. connection refused or a
    timeout), after recording the outage (:func:`report_failure`).
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._scripts: tuple[Script, Script] | None = None

    def key(self, task_name: str) -> str:
        """Return the Redis key of ``task_name``'s bucket, with the cache's ``KEY_PREFIX`` and version."""
        from django.core.cache import caches

        return str(caches[self.alias].make_key(f"django_debounce:bucket:{task_name}"))

    def ttl(self, bucket: TokenBucket) -> int:
        """Return the seconds a bucket key lives after a take: its refill time plus :data:`KEY_TTL_MARGIN`."""
        return math.ceil(bucket.capacity / bucket.per_second) + KEY_TTL_MARGIN

    def _client(self) -> Redis:
        from django_redis import get_redis_connection

        client: Redis = get_redis_connection(self.alias)
        return client

    def _call(self, what: str, fn: Any) -> Any:
        """Run ``fn(client, scripts)``; turn a Redis failure into :class:`RedisUnavailable`."""
        from redis.exceptions import RedisError

        try:
            client = self._client()
            if self._scripts is None:
                self._scripts = (
                    client.register_script(TAKE_LUA),
                    client.register_script(REFUND_LUA),
                )
            result = fn(client, self._scripts)
        except RedisError as exc:
            report_failure(self.alias, what, exc)
            raise RedisUnavailable(str(exc)) from exc
        report_success(self.alias)
        return result

    def levels(self, buckets: Mapping[str, TokenBucket]) -> dict[str, Level]:
        """Return the stored level of each task name's bucket (one round trip, no change).

        Args:
            buckets: task name -> its bucket (only the names are used).
        """
        names = sorted(buckets)
        if not names:
            return {}

        def read(client: Redis, scripts: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.hmget(self.key(name), ["tokens", "at"])
            return pipe.execute()

        rows = self._call("read bucket levels", read)
        out = {}
        for name, (tokens, at) in zip(names, rows, strict=True):
            if tokens is None or at is None:
                out[name] = Level(None, None)
            else:
                out[name] = Level(_number(tokens), _instant(at))
        return out

    def take(self, task_name: str, bucket: TokenBucket, now: datetime, count: int = 1) -> Take:
        """Take up to ``count`` whole tokens from ``task_name``'s bucket at ``now``, atomically.

        Args:
            task_name: the task whose bucket it is.
            bucket: its shape (capacity, refill rate), from the task's ``rate_limit=``.
            now: the claim's instant (aware; ``timezone.now()``, §4.7).
            count: tokens wanted (≥ 1).

        Returns:
            A :class:`Take`: tokens granted (0 to ``count``) and the level after it.
        """
        args = [bucket.capacity, repr(bucket.per_second), _epoch(now), count, self.ttl(bucket)]

        def run(client: Redis, scripts: Any) -> list[Any]:
            result: list[Any] = scripts[0](keys=[self.key(task_name)], args=args, client=client)
            return result

        granted, level, at = self._call("take a token", run)
        return Take(int(granted), Level(float(level), _instant(at)))

    def refund(self, task_name: str, bucket: TokenBucket, count: int) -> None:
        """Give ``count`` tokens back to ``task_name``'s bucket (capped at its capacity)."""

        def run(client: Redis, scripts: Any) -> None:
            scripts[1](keys=[self.key(task_name)], args=[bucket.capacity, count], client=client)

        self._call("give tokens back", run)


# -- which store, and the outage state --------------------------------------------------


class _Health:
    """Per process: whether Redis failed lately, and when to try it again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down = False
        self.retry_at = 0.0


_health = _Health()
_stores: dict[str, RedisBuckets] = {}


def store() -> RedisBuckets | None:
    """Return the Redis bucket store to use now, or ``None`` for the database bucket.

    ``None`` when ``DEBOUNCE_REDIS`` is ``None``, and for
    :data:`PROBE_INTERVAL` seconds (monotonic) after a Redis call failed; the
    first call after that interval gets the store again, and its Redis call
    is the probe.

    Raises:
        ConfigurationError: ``DEBOUNCE_REDIS`` is invalid (check E035).
    """
    alias = settings.redis
    if alias is None:
        return None
    if _health.down and time.monotonic() < _health.retry_at:
        return None
    found = _stores.get(alias)
    if found is None:
        found = _stores[alias] = RedisBuckets(alias)
    return found


def report_failure(alias: str, what: str, exc: BaseException) -> None:
    """Record that Redis failed: the database bucket is used for :data:`PROBE_INTERVAL` seconds.

    Logs one warning per outage (action ``redis_down``); later failures of the
    same outage only move the next probe.
    """
    with _health.lock:
        first = not _health.down
        _health.down = True
        _health.retry_at = time.monotonic() + PROBE_INTERVAL
    if first:
        logger.warning(
            "Redis (cache %r) failed to %s: %s; rate-limit buckets use the database "
            "until it answers again (next try in %.0f s)",
            alias,
            what,
            exc,
            PROBE_INTERVAL,
            extra={"action": "redis_down"},
        )


def report_success(alias: str) -> None:
    """Record that Redis answered; after an outage, log that the Redis buckets are back."""
    if not _health.down:
        return
    with _health.lock:
        was_down = _health.down
        _health.down = False
    if was_down:
        logger.info(
            "Redis (cache %r) answers again; rate-limit buckets are back in Redis",
            alias,
            extra={"action": "redis_up"},
        )


def is_down() -> bool:
    """Return whether this process saw Redis fail and has not seen it answer since."""
    return _health.down


def _forget(*, setting: str, **kwargs: Any) -> None:
    """Drop kept stores (and the outage state) when ``DEBOUNCE_REDIS`` or ``CACHES`` changes."""
    if setting in ("DEBOUNCE_REDIS", "CACHES"):
        _stores.clear()
        with _health.lock:
            _health.down = False
            _health.retry_at = 0.0


setting_changed.connect(_forget, dispatch_uid="django_debounce.redis_buckets")


__all__ = [
    "KEY_TTL_MARGIN",
    "PROBE_INTERVAL",
    "Level",
    "RedisBuckets",
    "RedisUnavailable",
    "Take",
    "is_down",
    "report_failure",
    "report_success",
    "store",
]
