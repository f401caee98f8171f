"""A rate limit per key holds across two worker processes, PostgreSQL or MariaDB (decision 189).

Two ``run_debounce_worker`` processes (two threads each, prefetch on) serve five
keys that the test calls every 20 ms for 4 s. Each key's window is 50 ms, so
without the limit each key would run about 15 times a second; with
``rate_limit_per_key="2/s"`` (capacity 2) its starts obey the bucket's rule: for
any two starts ``a <= b`` of one key, the starts in ``[a, b]`` are at most
``2 + 2 * (b - a)`` (``tests/soak_checks.worst_rate_interval``, the rule the
task-wide bucket's accuracy test asserts). Starts are the jobs' ``started_at``,
the claim's instant, which is the bucket's clock. It runs with the buckets in the
database and, ``DEBOUNCE_REDIS`` set in both workers, in Redis (decision 193).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_debounce.flow.throttle import bucket_for
from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis
from tests.soak_checks import worst_rate_interval
from tests.testapp import tasks_keyrate
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KEYS = [f"k{i}" for i in range(5)]
SECONDS = 4.0


@pytest.fixture
def keyed() -> Iterator[Any]:
    yield tasks_keyrate.register()
    tasks_keyrate.unregister()


@pytest.fixture(params=["database", "redis"])
def store_env(request) -> Iterator[dict[str, str]]:
    """The workers' environment: the buckets per key in the database, or in Redis."""
    if request.param == "database":
        yield child_env(DEBOUNCE_KEYRATE_TASKS="1")
        return
    require_redis()
    yield child_env(
        DEBOUNCE_KEYRATE_TASKS="1",
        DEBOUNCE_TEST_REDIS="1",
        DEBOUNCE_TEST_REDIS_URL=cache_url(),
        DEBOUNCE_TEST_REDIS_PREFIX=key_prefix(),
    )
    delete_test_keys(cache_url(), key_prefix())


def test_each_keys_rate_holds_across_two_workers(tmp_path, keyed, store_env):
    bucket = bucket_for(tasks_keyrate.OPTIONS["rate_limit_per_key"])
    with processes(tmp_path, store_env) as procs:
        workers = [procs.worker("--concurrency", "2", name=f"worker-{i}") for i in range(2)]
        wait_for(
            lambda: all("starting" in w.stderr() for w in workers),
            timeout=60,
            what=lambda: f"both workers to start\n{procs.tails()}",
        )
        began, n = time.monotonic(), 0
        while time.monotonic() - began < SECONDS:
            for key in KEYS:
                keyed.delay(key, n)
            n += 1
            time.sleep(0.02)
        if "DEBOUNCE_TEST_REDIS" in store_env:  # each key's bucket is in Redis (1 s TTL)
            found = redis.Redis.from_url(cache_url()).scan_iter(
                match=f"{key_prefix()}:*keybucket:{tasks_keyrate.NAME}:*"
            )
            assert len(list(found)) == len(KEYS)
        time.sleep(0.5)
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(60) == 0, worker.tail()
        stderr = "".join(w.stderr() for w in workers)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(set(CallLog.objects.values_list("pid", flat=True))) == 2  # both took part
    counts = {}
    for key in KEYS:
        starts = sorted(
            Job.objects.filter(
                task_name=tasks_keyrate.NAME, debounce_key=key, started_at__isnull=False
            ).values_list("started_at", flat=True)
        )
        worst = worst_rate_interval(starts, bucket.capacity, bucket.per_second)
        assert worst is not None and worst.excess <= 1e-9, f"key {key}: rate exceeded: {worst}"
        counts[key] = len(starts)
    print(f"\n[rate per key 2/s, two workers, {SECONDS:g} s] starts per key: {counts}")
    # At most capacity + rate * the span; and the limit, not the workers, was what held
    # them back: each key ran at least about half of what the bucket allowed.
    assert all(4 <= count <= 2 + 2 * (SECONDS + 1) for count in counts.values()), counts
