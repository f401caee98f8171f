"""The Redis bucket store across real worker processes (issue #10 item 2; decisions 100-104).

Two ``run_debounce_worker`` subprocesses with ``DEBOUNCE_REDIS`` share one
token bucket in Redis (no TaskState row is locked for a task gated by a rate
limit alone). A private ``redis-server`` of the test's own is killed mid-run:
the workers carry on with the database bucket (one warning each), lose no
job, and use Redis again once it is back. The shared Redis on 6379 is never
stopped.
"""

from __future__ import annotations

import time

import pytest
import redis

from django_debounce.enqueueing.call import enqueue
from django_debounce.models import DeadLetter, Job, TaskState
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.redis_support import (
    cache_url,
    delete_test_keys,
    key_prefix,
    private_redis,
    require_redis,
)
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

WORKER = ("--concurrency", "4", "--poll-interval", "0.05")


def env(url: str) -> dict[str, str]:
    return child_env(
        DEBOUNCE_REDIS_TASKS="1",
        DEBOUNCE_TEST_REDIS="1",
        DEBOUNCE_TEST_REDIS_URL=url,
        DEBOUNCE_TEST_REDIS_PREFIX=key_prefix(),
    )


def bucket_keys(url: str, name: str) -> list[bytes]:
    return list(redis.Redis.from_url(url).scan_iter(match=f"{key_prefix()}:*bucket:{name}"))


def ran(name: str) -> int:
    return CallLog.objects.filter(task=name).count()


def test_a_rate_limit_holds_across_two_workers_with_the_redis_bucket(tmp_path):
    """5/h, 15 jobs due, two workers: exactly 5 run (the next token is 12 minutes away)."""
    require_redis()
    url = cache_url()
    try:
        with processes(tmp_path, env(url)) as procs:
            workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
            wait_for(
                lambda: all("starting" in worker.stderr() for worker in workers),
                timeout=60,
                what=lambda: f"both workers to start\n{procs.tails()}",
            )
            ids = [enqueue("rb.limited", args=[f"l{i:02}"]).pk for i in range(15)]
            wait_for(lambda: ran("rb.limited") >= 5, timeout=30, what=procs.tails)
            time.sleep(2.0)  # ~40 more polls of each worker: none may find a token
            assert ran("rb.limited") == 5
            assert all(worker.alive() for worker in workers)
            stderr = "".join(worker.stderr() for worker in workers)
        assert "Traceback" not in stderr and "redis_down" not in stderr
        assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == 5
        assert Job.objects.filter(pk__in=ids, status=Job.Status.READY).count() == 10
        assert not TaskState.objects.filter(task_name="rb.limited").exists()  # Redis held it
        [key] = bucket_keys(url, "rb.limited")
        assert float(redis.Redis.from_url(url).hget(key, "tokens")) < 0.01  # refill of ms only
    finally:
        delete_test_keys(url, key_prefix())


@pytest.mark.slow
def test_redis_stopped_mid_run_the_workers_carry_on_with_the_database_and_come_back(tmp_path):
    """2/s, 40 jobs: Redis killed after some runs, restarted later; every job runs once."""
    with private_redis(tmp_path) as server:
        with processes(tmp_path, env(server.url)) as procs:
            workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
            wait_for(
                lambda: all("starting" in worker.stderr() for worker in workers),
                timeout=60,
                what=lambda: f"both workers to start\n{procs.tails()}",
            )
            ids = [enqueue("rb.steady", args=[f"s{i:02}"]).pk for i in range(40)]
            wait_for(lambda: ran("rb.steady") >= 6, timeout=30, what=procs.tails)
            assert bucket_keys(server.url, "rb.steady")  # the bucket is in Redis
            assert not TaskState.objects.filter(task_name="rb.steady").exists()

            server.stop()
            before = ran("rb.steady")
            wait_for(lambda: ran("rb.steady") >= before + 6, timeout=30, what=procs.tails)
            # The database bucket took over (its row exists now), and each worker said so once.
            assert TaskState.objects.get(task_name="rb.steady").tokens_at is not None
            wait_for(
                lambda: all("rate-limit buckets use the database" in w.stderr() for w in workers),
                timeout=10,
                what=procs.tails,
            )

            server.start()  # empty: it kept nothing
            wait_for(
                lambda: all("answers again" in w.stderr() for w in workers),
                timeout=30,
                what=procs.tails,
            )
            wait_for(lambda: bucket_keys(server.url, "rb.steady"), timeout=10, what=procs.tails)
            # A claim that began while Redis was down may still end on the database bucket:
            # read its row once a few more jobs ran on Redis.
            back = ran("rb.steady")
            wait_for(lambda: ran("rb.steady") >= min(40, back + 3), timeout=30, what=procs.tails)
            db_bucket = TaskState.objects.get(task_name="rb.steady").tokens_at
            wait_for(lambda: ran("rb.steady") == 40, timeout=60, what=procs.tails)
            assert all(worker.alive() for worker in workers)
            stderr = [worker.stderr() for worker in workers]
    for text in stderr:
        assert text.count("rate-limit buckets use the database") == 1, text[-3000:]
    # Back on Redis, the database bucket was not used again.
    assert TaskState.objects.get(task_name="rb.steady").tokens_at == db_bucket
    logs = list(CallLog.objects.filter(task="rb.steady"))
    assert sorted(log.key for log in logs) == [f"s{i:02}" for i in range(40)]  # each ran once
    assert Job.objects.filter(pk__in=ids, status=Job.Status.SUCCESSFUL).count() == 40
    assert DeadLetter.objects.count() == 0
