"""Rate-limit token buckets in Redis (issue #10 item 2; decisions 100-104), against a real Redis.

The Lua take gives exact token counts under the frozen clock (§4.7, §6,
§11); a claim takes its tokens there instead of the TaskState row, gives
back the tokens of jobs it did not get and of a claim that rolled back, and
falls back to the database bucket while Redis is unreachable, coming back to
Redis once it answers. Stopping Redis uses a private ``redis-server`` of the
test's own, never the shared one.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import OperationalError, transaction

from django_debounce import registry, task
from django_debounce.claim import claiming as claim_module
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow import redis_buckets
from django_debounce.flow.redis_buckets import KEY_TTL_MARGIN, Level, RedisBuckets
from django_debounce.flow.redis_tokens import TokenLedger
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job, TaskState
from tests.conftest import T
from tests.factories import JobFactory
from tests.redis_support import (
    cache_url,
    delete_test_keys,
    key_prefix,
    private_redis,
    require_redis,
)

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=60)
READY, RUNNING, SHED = Job.Status.READY, Job.Status.RUNNING, Job.Status.SHED


@pytest.fixture
def store(settings: Any) -> Iterator[RedisBuckets]:
    """``DEBOUNCE_REDIS = "redis"`` on the local Redis; this process's keys deleted after."""
    require_redis()
    settings.DEBOUNCE_REDIS = "redis"
    found = redis_buckets.store()
    assert found is not None
    yield found
    delete_test_keys(cache_url(), key_prefix())


def raw() -> redis.Redis:
    return redis.Redis.from_url(cache_url())


def stored(store: RedisBuckets, name: str) -> Level:
    return store.levels({name: bucket_for("1/s")})[name]


def _noop(*args: Any) -> None: ...


@pytest.fixture
def rated() -> Iterator[Any]:
    """Register ``rb.rate`` ("3/m") and ``rb.drop`` ("2/m", drop) for one test."""
    task(name="rb.rate", rate_limit="3/m")(_noop)
    task(name="rb.drop", rate_limit="2/m", on_excess="drop")(_noop)
    yield
    registry.unregister("rb.rate")
    registry.unregister("rb.drop")


def claim(limit: int = 10, worker_id: str = "w") -> list[int]:
    return [job.pk for job in claim_jobs(worker_id=worker_id, limit=limit, lease=LEASE)]


# -- the Lua take: exact counts under the clock ---------------------------------------------


def test_a_take_counts_whole_tokens_and_refills_continuously(store, clock):
    bucket = bucket_for("3/m")  # capacity 3, one token every 20 s
    took = [store.take("rb.t", bucket, T) for _ in range(4)]
    assert [t.granted for t in took] == [1, 1, 1, 0]
    assert [t.level.tokens for t in took] == [2.0, 1.0, 0.0, 0.0]
    assert stored(store, "rb.t") == Level(0.0, T)
    # Half a token after 10 s: refused, and nothing is written.
    assert store.take("rb.t", bucket, T + 10 * S).granted == 0
    assert stored(store, "rb.t") == Level(0.0, T)
    # One whole token after 20 s (20 × 3/60 is 0.999…: rounding noise forgiven, as in the DB).
    took = store.take("rb.t", bucket, T + 20 * S)
    assert (took.granted, took.level) == (1, Level(0.0, T + 20 * S))
    # Ten minutes later the bucket is full again, and no fuller than its capacity.
    assert store.take("rb.t", bucket, T + 620 * S, count=5).granted == 3


def test_a_clock_gone_back_refills_nothing_and_never_moves_the_instant_back(store):
    bucket = bucket_for("3/m")
    assert store.take("rb.t", bucket, T + 60 * S).level == Level(2.0, T + 60 * S)
    took = store.take("rb.t", bucket, T + 30 * S)  # another worker's clock, 30 s behind
    assert (took.granted, took.level) == (1, Level(1.0, T + 60 * S))


def test_tokens_given_back_are_capped_at_the_capacity(store):
    bucket = bucket_for("3/m")
    store.take("rb.t", bucket, T, count=2)
    store.refund("rb.t", bucket, 1)
    assert stored(store, "rb.t") == Level(2.0, T)
    store.refund("rb.t", bucket, 5)
    assert stored(store, "rb.t") == Level(3.0, T)


def test_a_bucket_key_carries_the_cache_prefix_and_expires_once_it_would_be_full(store):
    bucket = bucket_for("3/m")  # empty to full: 60 s
    store.take("rb.t", bucket, T)
    key = store.key("rb.t")
    assert key.startswith(f"{key_prefix()}:") and key.endswith(":django_debounce:bucket:rb.t")
    assert 60 + KEY_TTL_MARGIN - 5 <= raw().ttl(key) <= 60 + KEY_TTL_MARGIN
    raw().delete(key)  # an expired key reads as full
    assert stored(store, "rb.t") == Level(None, None)
    assert store.take("rb.t", bucket, T, count=9).granted == 3


def test_the_burst_option_sets_the_capacity(store):
    bucket = bucket_for("1/m", 4)
    assert store.take("rb.t", bucket, T, count=9).granted == 4


# -- the claim takes its tokens in Redis ----------------------------------------------------


def test_a_claim_takes_tokens_in_redis_and_leaves_the_task_state_alone(store, clock, rated):
    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(5)]
    assert claim() == ids[:3]
    assert stored(store, "rb.rate") == Level(0.0, T)
    assert not TaskState.objects.filter(task_name="rb.rate").exists()  # no row, no lock
    assert claim() == []
    clock(seconds=20)
    assert claim() == ids[3:4]
    clock(seconds=30)  # half a token more: nothing
    assert claim() == []
    clock(seconds=40)
    assert claim() == ids[4:]
    assert Job.objects.filter(status=RUNNING).count() == 5


def test_tokens_taken_ahead_and_not_used_go_back_before_the_commit(store, clock):
    """One script call takes what the claim may use; a concurrency cap then admits fewer."""
    task(name="rb.capped", rate_limit="5/m", concurrency=2)(_noop)
    try:
        ids = [JobFactory(task_name="rb.capped", args=[i], run_at=T).pk for i in range(4)]
        assert claim() == ids[:2]
        assert stored(store, "rb.capped") == Level(3.0, T)  # 4 taken at once, 2 given back
        assert TaskState.objects.get(task_name="rb.capped").tokens is None  # the row: the cap
    finally:
        registry.unregister("rb.capped")


def test_a_drop_task_sheds_what_the_redis_bucket_refuses(store, clock, rated):
    ids = [JobFactory(task_name="rb.drop", args=[i], run_at=T).pk for i in range(4)]
    assert claim() == ids[:2]
    assert dict(Job.objects.values_list("pk", "status")) == {
        ids[0]: RUNNING,
        ids[1]: RUNNING,
        ids[2]: SHED,
        ids[3]: SHED,
    }
    letters = DeadLetter.objects.order_by("job_id")
    assert [letter.job_id for letter in letters] == ids[2:]
    assert all(letter.reason == "shed: rate limit 2/m exceeded" for letter in letters)


def test_a_bucket_shared_with_another_process_is_respected(store, clock, rated):
    """Tokens another worker took (straight in Redis) are not there for this claim."""
    store.take("rb.rate", bucket_for("3/m"), T, count=2)
    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(3)]
    assert claim() == ids[:1]


def test_a_claim_that_rolls_back_gives_its_tokens_back(store, clock, rated, monkeypatch):
    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(2)]

    def fails(*args: Any, **kwargs: Any) -> int:
        raise OperationalError("connection lost while marking the jobs RUNNING")

    with monkeypatch.context() as patched:
        patched.setattr(claim_module, "mark_running", fails)
        with pytest.raises(OperationalError):
            claim()
    assert stored(store, "rb.rate") == Level(3.0, T)  # two taken, two given back
    assert list(Job.objects.filter(status=READY).values_list("pk", flat=True).order_by("pk")) == ids
    assert claim() == ids
    assert stored(store, "rb.rate") == Level(1.0, T)


def test_the_ledger_gives_back_the_takes_of_a_block_that_raised(store):
    bucket = bucket_for("3/m")
    with pytest.raises(ZeroDivisionError):
        with TokenLedger() as ledger, transaction.atomic():
            ledger.take(store, "rb.t", bucket, T)
            ledger.take(store, "rb.t", bucket, T)
            assert stored(store, "rb.t") == Level(1.0, T)
            1 / 0  # noqa: B018
    assert stored(store, "rb.t") == Level(3.0, T)
    with TokenLedger() as ledger, transaction.atomic():
        ledger.take(store, "rb.t", bucket, T)
    assert stored(store, "rb.t") == Level(2.0, T)  # committed: kept


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_locked_elsewhere_costs_no_redis_token(store, clock, rated):
    """The claim loses a job it admitted (another transaction holds its row): the token goes back."""
    from tests.db.claim.test_gated_claim_locks import held_open, lock_rows
    from tests.procs import in_thread

    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(5)]
    with held_open(lock_rows(ids[0])):
        assert in_thread(lambda: claim(2, "w1")) == ids[1:3]
        assert stored(store, "rb.rate") == Level(1.0, T)
    assert claim(5, "w2") == ids[:1]
    assert stored(store, "rb.rate") == Level(0.0, T)


# -- Redis unreachable: the database bucket, and back --------------------------------------


def _point_at(settings: Any, url: str) -> None:
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["redis"]["LOCATION"] = url
    settings.CACHES = caches
    settings.DEBOUNCE_REDIS = "redis"


def test_redis_down_falls_back_to_the_database_bucket_and_comes_back(
    settings, clock, rated, tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(redis_buckets, "PROBE_INTERVAL", 0.0)  # probe at every claim
    caplog.set_level(logging.INFO, logger="django_debounce.redis")
    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(9)]
    with private_redis(tmp_path) as server:
        _point_at(settings, server.url)
        assert claim(1) == ids[:1]
        live = redis_buckets.store()
        assert live is not None and stored(live, "rb.rate") == Level(2.0, T)

        server.stop()
        # Down: the database bucket (full: it was never used) admits its capacity.
        assert claim(5) == ids[1:4]
        state = TaskState.objects.get(task_name="rb.rate")
        assert (state.tokens, state.tokens_at) == (0.0, T)
        assert claim(5) == []  # a second claim while down: still the database bucket
        assert redis_buckets.is_down()

        server.start()  # an empty Redis (it kept nothing): a full bucket there
        clock(seconds=1)
        assert claim(5) == ids[4:7]
        assert not redis_buckets.is_down()
        assert stored(live, "rb.rate") == Level(0.0, T + S)
        state.refresh_from_db()
        assert (state.tokens, state.tokens_at) == (0.0, T)  # the database bucket untouched
    downs = [r for r in caplog.records if getattr(r, "action", "") == "redis_down"]
    ups = [r for r in caplog.records if getattr(r, "action", "") == "redis_up"]
    assert len(downs) == 1 and downs[0].levelno == logging.WARNING  # logged once per outage
    assert len(ups) == 1
    assert Job.objects.filter(status=RUNNING).count() == 7
    assert Job.objects.filter(status=READY).count() == 2  # nothing lost


def test_while_down_redis_is_not_tried_before_the_probe_interval(settings, rated, tmp_path):
    with private_redis(tmp_path) as server:
        _point_at(settings, server.url)
        assert redis_buckets.store() is not None
        server.stop()
        JobFactory(task_name="rb.rate", run_at=T - S)
        assert len(claim()) == 1
        assert redis_buckets.is_down()
        assert redis_buckets.store() is None  # within PROBE_INTERVAL (5 s): the database


def test_a_drop_task_is_not_shed_when_redis_fails_mid_claim(store, clock, rated, monkeypatch):
    """A failure after the claim read the levels holds the job (never sheds it)."""
    ids = [JobFactory(task_name="rb.drop", args=[i], run_at=T).pk for i in range(3)]

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        redis_buckets.report_failure("redis", "take a token", ConnectionError("refused"))
        raise redis_buckets.RedisUnavailable("refused")

    monkeypatch.setattr(RedisBuckets, "take", unreachable)
    assert claim() == []
    assert set(Job.objects.values_list("status", flat=True)) == {READY}
    assert DeadLetter.objects.count() == 0
    monkeypatch.undo()
    monkeypatch.setattr(redis_buckets, "PROBE_INTERVAL", 0.0)
    assert claim() == ids[:2]


# -- the admin's "why is this job waiting" reads the Redis level ---------------------------


def test_hold_reasons_show_the_redis_bucket(store, clock, rated):
    from django_debounce.flow.hold_reasons import flow_view, held_back

    ids = [JobFactory(task_name="rb.rate", args=[i], run_at=T).pk for i in range(4)]
    assert held_back(Job.objects.get(pk=ids[0])) == []
    assert flow_view("rb.rate", None, now=T).tokens == 3.0
    assert claim() == ids[:3]
    [hold] = held_back(Job.objects.get(pk=ids[3]))
    assert (hold.code, hold.until) == ("rate_limit", T + 20 * S)
    view = flow_view("rb.rate", None, now=T + 10 * S)
    assert (view.tokens, view.next_token_at) == (0.5, T + 20 * S)
