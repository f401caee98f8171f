"""Per-key buckets in Redis (``rate_limit_per_key=`` with ``DEBOUNCE_REDIS``; decisions 193-194).

Against a real Redis, under the frozen clock, as the task-wide Redis bucket's
tests (test_redis_buckets.py): exact levels per key, a key's Redis hash with
the cache prefix and a TTL of the refill time, drop sheds what Redis refuses,
tokens another process took are respected, a key's token goes back when a
later rule (the task's own Redis bucket) refuses the job and when the claim
rolls back, and Redis down means the database buckets until it answers again
(a take failing mid-claim holds, never sheds). Stopping Redis uses a private
``redis-server``, never the shared one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import OperationalError

from django_debounce import registry, task
from django_debounce.claim import claiming as claim_module
from django_debounce.flow import hold_reasons, redis_buckets
from django_debounce.flow.redis_buckets import Level, RedisUnavailable
from django_debounce.flow.redis_key_buckets import RedisKeyBuckets, key_store, scoped
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job, KeyBucket
from tests.conftest import T
from tests.db.flow.test_key_rates import _log, call_then_claim, claim_and_finish
from tests.redis_support import (
    cache_url,
    delete_test_keys,
    key_prefix,
    private_redis,
    require_redis,
)

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
READY, RUNNING, SHED = Job.Status.READY, Job.Status.RUNNING, Job.Status.SHED
THREE_A_MINUTE = bucket_for("3/m")


@pytest.fixture
def store(settings: Any) -> Iterator[RedisKeyBuckets]:
    """``DEBOUNCE_REDIS = "redis"`` on the local Redis; this process's keys deleted after."""
    require_redis()
    settings.DEBOUNCE_REDIS = "redis"
    found = key_store()
    assert found is not None
    yield found
    delete_test_keys(cache_url(), key_prefix())


@pytest.fixture
def keyed() -> Iterator[dict[str, Any]]:
    """A defer-mode and a drop-mode task: 3 runs a minute per customer (the first argument)."""
    options = {
        "debounce": "1s",
        "debounce_max_wait": "1h",
        "debounce_key": "{0}",
        "rate_limit_per_key": "3/m",
    }
    tasks = {
        "defer": task(name="rk.defer", **options)(_log),
        "drop": task(name="rk.drop", on_excess="drop", **options)(_log),
    }
    yield tasks
    for created in tasks.values():
        registry.unregister(created.name)


def key_hash(task_name: str, key: str) -> str:
    job = Job.objects.filter(task_name=task_name, debounce_key=key).first()
    assert job is not None
    return job.key_hash


def level(store: RedisKeyBuckets, task_name: str, key: str) -> Level:
    name = scoped((task_name, key_hash(task_name, key)))
    return store.levels({name: THREE_A_MINUTE})[name]


def test_each_key_has_its_own_redis_bucket_and_refills_exactly(store, clock, keyed):
    created = keyed["defer"]
    assert call_then_claim(clock, created, 0, 0) == [("acme", 0), ("bolt", 0)]
    assert level(store, "rk.defer", "acme") == Level(2.0, T + S)
    assert KeyBucket.objects.count() == 0  # keys with tokens left have no row
    assert call_then_claim(clock, created, 1, 1) == [("acme", 1), ("bolt", 1)]
    assert call_then_claim(clock, created, 2, 2, keys=("acme",)) == [("acme", 2)]
    # 3/m: a token every 20 s; takes at 1 s, 2 s and 3 s leave 3 - 3 + 2/20.
    acme = level(store, "rk.defer", "acme")
    assert acme.tokens == pytest.approx(0.1) and acme.tokens_at == T + 3 * S
    assert level(store, "rk.defer", "bolt") == Level(pytest.approx(1.05), T + 2 * S)
    # The key left without a token has its row: when its next token comes, for the claim.
    (row,) = KeyBucket.objects.all()
    assert row.key_hash == key_hash("rk.defer", "acme")
    assert row.blocked_until is not None
    assert (row.blocked_until - T).total_seconds() == pytest.approx(21, abs=1e-5)
    assert (row.full_at - T).total_seconds() == pytest.approx(61, abs=1e-5)
    assert call_then_claim(clock, created, 3, 3) == [("bolt", 3)]  # acme waits
    until = row.blocked_until
    clock(at=until - dt.timedelta(milliseconds=1))
    assert claim_and_finish() == []
    clock(at=until)
    assert claim_and_finish() == [("acme", 3)]
    assert level(store, "rk.defer", "acme").tokens == pytest.approx(0.0, abs=1e-6)
    assert DeadLetter.objects.count() == 0


def test_a_key_bucket_has_the_cache_prefix_and_lives_for_its_refill_time(store, clock, keyed):
    call_then_claim(clock, keyed["defer"], 0, 0, keys=("acme",))
    name = scoped(("rk.defer", key_hash("rk.defer", "acme")))
    key = store.key(name)
    assert key.startswith(f"{key_prefix()}:") and key.endswith(f"django_debounce:keybucket:{name}")
    ttl = redis.Redis.from_url(cache_url()).ttl(key)
    assert 59 <= ttl <= 60  # 3/m: empty to full in 60 s; an expired key reads as full


def test_drop_sheds_what_the_key_bucket_in_redis_refuses(store, clock, keyed):
    created = keyed["drop"]
    for n in range(3):
        assert call_then_claim(clock, created, n, n) == [("acme", n), ("bolt", n)]
    assert call_then_claim(clock, created, 3, 3, keys=("acme",)) == []
    (shed,) = Job.objects.filter(task_name="rk.drop", status=SHED)
    assert shed.args == ["acme", 3]
    (letter,) = DeadLetter.objects.filter(job=shed)
    assert letter.reason == "shed: rate limit per key 3/m exceeded"
    assert letter.metadata == {"shed": True, "rate_limit_per_key": "3/m", "capacity": 3}
    assert KeyBucket.objects.count() == 0  # drop mode writes no row
    assert call_then_claim(clock, created, 20, 4, keys=("acme",)) == [("acme", 4)]


def test_tokens_another_process_took_are_respected(store, clock, keyed):
    created = keyed["drop"]
    clock(seconds=0)
    created.delay("acme", 0)
    created.delay("bolt", 0)
    name = scoped(("rk.drop", key_hash("rk.drop", "acme")))
    assert store.take(name, THREE_A_MINUTE, T, count=3).granted == 3  # another worker
    clock(seconds=1)
    assert claim_and_finish() == [("bolt", 0)]
    assert Job.objects.get(debounce_key="acme").status == SHED


def test_the_take_decides_not_a_stale_level(store, clock, keyed, monkeypatch):
    """A level read before another claim gave a token back says empty: the take still admits."""
    created = keyed["drop"]
    clock(seconds=0)
    created.delay("acme", 0)
    clock(seconds=1)

    def stale(self: Any, buckets: Any) -> dict[str, Level]:
        return {name: Level(0.0, T + S) for name in buckets}

    monkeypatch.setattr(RedisKeyBuckets, "levels", stale)
    assert claim_and_finish() == [("acme", 0)]  # not shed: Redis held 3 tokens
    monkeypatch.undo()
    assert level(store, "rk.drop", "acme") == Level(2.0, T + S)
    assert DeadLetter.objects.count() == 0


def test_a_later_refusal_gives_the_key_token_back(store, clock):
    """The task's own Redis bucket refuses after the key's token was taken: it goes back."""
    created = task(
        name="rk.both",
        debounce="1s",
        debounce_max_wait="1h",
        debounce_key="{0}",
        rate_limit="1/h",
        rate_limit_per_key="3/m",
    )(_log)
    try:
        assert call_then_claim(clock, created, 0, 0) == [("acme", 0)]
        assert level(store, "rk.both", "acme") == Level(2.0, T + S)
        assert level(store, "rk.both", "bolt") == Level(3.0, T + S)  # taken, then given back
        assert Job.objects.get(debounce_key="bolt").status == READY
        assert KeyBucket.objects.count() == 0
    finally:
        registry.unregister("rk.both")


def test_a_claim_that_rolls_back_gives_the_key_tokens_back(store, clock, keyed, monkeypatch):
    created = keyed["defer"]
    clock(seconds=0)
    created.delay("acme", 0)
    created.delay("bolt", 0)
    clock(seconds=1)

    def fails(*args: Any, **kwargs: Any) -> int:
        raise OperationalError("connection lost while marking the jobs RUNNING")

    with monkeypatch.context() as patched:
        patched.setattr(claim_module, "mark_running", fails)
        with pytest.raises(OperationalError):
            claim_and_finish()
    assert level(store, "rk.defer", "acme") == Level(3.0, T + S)
    assert level(store, "rk.defer", "bolt") == Level(3.0, T + S)
    assert claim_and_finish() == [("acme", 0), ("bolt", 0)]
    assert level(store, "rk.defer", "acme") == Level(2.0, T + S)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_locked_elsewhere_costs_no_key_token(store, clock, keyed):
    """The claim loses a job it admitted (another transaction holds its row): no token is spent."""
    from tests.db.claim.test_gated_claim_locks import held_open, lock_rows
    from tests.procs import in_thread

    created = keyed["defer"]
    clock(seconds=0)
    ids = [created.delay(key, 0).pk for key in ("acme", "bolt")]
    clock(seconds=1)
    with held_open(lock_rows(ids[0])):
        assert in_thread(claim_and_finish) == [("bolt", 0)]
    assert level(store, "rk.defer", "acme") == Level(None, None)  # never taken (or given back)
    assert level(store, "rk.defer", "bolt") == Level(2.0, T + S)
    assert claim_and_finish() == [("acme", 0)]
    assert level(store, "rk.defer", "acme") == Level(2.0, T + S)


def test_hold_reasons_read_the_key_level_in_redis(store, clock, keyed):
    created = keyed["defer"]
    for n in range(3):
        call_then_claim(clock, created, n, n, keys=("acme",))
    clock(seconds=3)
    job = created.delay("acme", 3)
    clock(seconds=4)
    assert claim_and_finish() == []
    KeyBucket.objects.all().delete()  # the reason comes from Redis, not from the row
    [hold] = hold_reasons.held_back(Job.objects.get(pk=job.pk))
    assert hold.code == "key_rate_limit" and hold.until is not None
    assert (hold.until - T).total_seconds() == pytest.approx(21, abs=1e-5)


def test_status_counts_the_keys_that_ran_dry_never_a_key(store, clock, keyed):
    """Under Redis, *in use* counts the keys with a row: those that ran out of tokens (194)."""
    from django_debounce.ops.status import collect_status

    created = keyed["defer"]
    for n in range(3):
        call_then_claim(clock, created, n, n)  # acme and bolt take all 3 tokens
    call_then_claim(clock, created, 3, 0, keys=("cara",))  # cara keeps 2
    (row,) = [r for r in collect_status()["per_key"] if r["task_name"] == "rk.defer"]
    assert (row["keys_in_use"], row["keys_waiting"]) == (2, 2)


def _point_at(settings: Any, url: str) -> None:
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["redis"]["LOCATION"] = url
    settings.CACHES = caches
    settings.DEBOUNCE_REDIS = "redis"


def test_redis_down_uses_the_database_key_buckets_and_comes_back(
    settings, clock, keyed, tmp_path, monkeypatch
):
    monkeypatch.setattr(redis_buckets, "PROBE_INTERVAL", 0.0)  # probe at every claim
    created = keyed["defer"]
    with private_redis(tmp_path) as server:
        _point_at(settings, server.url)
        assert call_then_claim(clock, created, 0, 0, keys=("acme",)) == [("acme", 0)]
        live = key_store()
        assert live is not None and level(live, "rk.defer", "acme") == Level(2.0, T + S)
        assert KeyBucket.objects.count() == 0

        server.stop()
        # Down: the claim's read fails before it took anything, so it uses the database bucket.
        assert call_then_claim(clock, created, 1, 1, keys=("acme",)) == [("acme", 1)]
        assert redis_buckets.is_down()
        row = KeyBucket.objects.get()
        assert (row.tokens, row.tokens_at) == (2.0, T + 2 * S)  # a full database bucket, one taken

        server.start()  # an empty Redis: a full bucket there
        assert call_then_claim(clock, created, 2, 2, keys=("acme",)) == [("acme", 2)]
        assert not redis_buckets.is_down()
        assert level(live, "rk.defer", "acme") == Level(2.0, T + 3 * S)
        row.refresh_from_db()
        assert (row.tokens, row.tokens_at) == (2.0, T + 2 * S)  # the database bucket untouched


def test_a_drop_job_is_held_not_shed_when_redis_fails_mid_claim(store, clock, keyed, monkeypatch):
    created = keyed["drop"]
    clock(seconds=0)
    created.delay("acme", 0)
    clock(seconds=1)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        redis_buckets.report_failure("redis", "take a token", ConnectionError("refused"))
        raise RedisUnavailable("refused")

    monkeypatch.setattr(RedisKeyBuckets, "take", unreachable)
    assert claim_and_finish() == []
    assert Job.objects.get().status == READY
    assert DeadLetter.objects.count() == 0
    monkeypatch.undo()
    monkeypatch.setattr(redis_buckets, "PROBE_INTERVAL", 0.0)
    assert claim_and_finish() == [("acme", 0)]
