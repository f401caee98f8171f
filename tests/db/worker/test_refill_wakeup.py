"""An idle worker wakes when a drained rate-limit bucket holds tokens again (decision 170).

It used to sleep its poll interval (1 s by default) whatever the bucket: a
bucket that refills faster than that (``rate_limit_burst`` below the rate, or a
rate such as ``"5/s"`` with a burst of 2) sat full while jobs waited, and the
refill was lost (``tests/processes/flow/test_rate_accuracy.py`` measured 1.9/s for
``"5/s"``, burst 2). The clock is frozen (§4.7): each sleep is exact.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from django_debounce import registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow.throttle import bucket_for
from django_debounce.worker import wakeup
from django_debounce.worker.deadlines import next_refill_at
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis

pytestmark = pytest.mark.django_db

LEASE = dt.timedelta(seconds=60)
SLACK = wakeup.DEADLINE_SLACK


def _noop(*args: Any) -> None: ...


@pytest.fixture
def rated() -> Iterator[dict[str, Any]]:
    """``rw.trickle`` (5/s, burst 2), ``rw.wide`` (20/s, burst 20), ``rw.drop`` (5/s, drop)."""
    tasks = {
        "rw.trickle": task(name="rw.trickle", rate_limit="5/s", rate_limit_burst=2)(_noop),
        "rw.wide": task(name="rw.wide", rate_limit="20/s")(_noop),
        "rw.drop": task(name="rw.drop", rate_limit="5/s", on_excess="drop")(_noop),
    }
    yield tasks
    for name in tasks:
        registry.unregister(name)


def drain(name: str, tasks: dict[str, Any], jobs: int) -> list[int]:
    """Enqueue ``jobs`` calls of ``name`` and claim what its bucket lets through now."""
    for i in range(jobs):
        tasks[name].delay(i)
    return [job.pk for job in claim_jobs(worker_id="w", limit=100, lease=LEASE)]


def idle(free: int = 4, cap: float = 1.0, since: dt.datetime | None = None) -> float:
    return wakeup.idle_timeout(cap, queues=[], using="default", free=free, since=since)


def test_a_drained_bucket_wakes_the_worker_at_its_next_token_not_at_the_poll(clock, rated):
    now = clock()
    assert len(drain("rw.trickle", rated, 6)) == 2  # the burst of 2; 4 jobs wait for refill
    # Burst 2: wake at one token (half the capacity), 0.2 s away; not at the 1 s poll.
    assert idle() == pytest.approx(0.2 + SLACK)
    assert next_refill_at(now, free=4) == now + dt.timedelta(seconds=0.2)
    clock(seconds=0.2)
    assert len(claim_jobs(worker_id="w", limit=100, lease=LEASE)) == 1  # the token is there


def test_a_token_that_came_after_the_claim_began_wakes_at_once_but_never_spins(clock, rated):
    """The race of the measurement: the claim saw 0.96 tokens, the idle read a moment later 1.04."""
    now = clock()
    assert len(drain("rw.trickle", rated, 6)) == 2  # stored: 0 tokens at T
    clock(seconds=0.25)  # a token arrived (at T + 0.2) after the claim began (T + 0.1, say)
    assert idle(since=now + dt.timedelta(seconds=0.1)) == pytest.approx(SLACK)  # claim now
    # A claim that began after the token came saw it: no job was waiting for it. Sleep the
    # poll (this read alone would wake the worker again and again).
    assert idle(since=now + dt.timedelta(seconds=0.25)) == 1.0


def test_the_wake_waits_for_tokens_enough_for_the_free_threads(clock, rated):
    clock()
    assert len(drain("rw.wide", rated, 30)) == 20  # the whole bucket
    assert idle(free=4) == pytest.approx(4 / 20 + SLACK)  # four tokens for four threads
    assert idle(free=1) == pytest.approx(1 / 20 + SLACK)
    assert idle(free=100) == pytest.approx(10 / 20 + SLACK)  # at most half the capacity
    assert idle(free=100, cap=0.25) == 0.25  # and never past the poll


def test_a_bucket_with_a_token_or_a_drop_task_is_no_deadline(clock, rated):
    clock()
    assert idle() == 1.0  # buckets never used: full
    assert len(drain("rw.drop", rated, 10)) == 5  # the rest is shed, nothing waits
    assert idle() == 1.0
    rated["rw.trickle"].delay("one")
    assert len(claim_jobs(worker_id="w", limit=100, lease=LEASE)) == 1
    assert idle() == 1.0  # one token left: a due job would have been claimed


def test_the_redis_bucket_wakes_the_worker_too(clock, rated, settings):
    require_redis()
    settings.DEBOUNCE_REDIS = "redis"
    try:
        clock()
        assert len(drain("rw.trickle", rated, 6)) == 2
        assert idle() == pytest.approx(0.2 + SLACK)
    finally:
        delete_test_keys(cache_url(), key_prefix())


def test_refill_target_and_seconds_until():
    bucket = bucket_for("5/s", 2)
    assert [bucket.refill_target(free) for free in (0, 1, 4)] == [1, 1, 1]
    wide = bucket_for("20/s")
    assert [wide.refill_target(free) for free in (1, 4, 50)] == [1, 4, 10]
    assert wide.seconds_until(0.5, 4) == pytest.approx(3.5 / 20)
    assert wide.seconds_until(5.0, 4) == 0.0
    assert wide.seconds_until(0.0, 99) == pytest.approx(1.0)  # capped at the capacity
