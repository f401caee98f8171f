"""Idle workers start new jobs at once, and due-later jobs at their run_at (issue #10, #12 item 4).

Real worker subprocesses with a 5 s poll interval: a start well under the
interval can only come from a wake-up (LISTEN/NOTIFY on PostgreSQL, Redis
pub/sub elsewhere) or, for a job due later, from sleeping until its deadline.
Each job records the instant it started (``wake.stamp``); the measured
medians are printed (``-s`` shows them).
"""

from __future__ import annotations

import statistics
import time

import pytest
from django.db import connection
from django.utils import timezone

from django_debounce.worker.wakeup_redis import PUBLISH_RETRY_AFTER
from tests.conftest import child_env
from tests.procs import app_name, pg_backends, processes, wait_for
from tests.redis_server import running
from tests.testapp.models import CallLog
from tests.testapp.tasks_wakeup import stamp

pytestmark = pytest.mark.django_db(transaction=True)

POLL = "5"
SAMPLES = 7


def _started(tag: str) -> CallLog | None:
    return CallLog.objects.filter(task="wake.stamp", key=tag).first()


def _idle_listening(worker, line: str) -> None:
    wait_for(lambda: line in worker.stderr(), timeout=30, what=worker.tail)
    time.sleep(0.5)  # past the start-up claims: the worker is in its idle wait


def _due_now_latencies(worker, prefix: str) -> list[float]:
    """Enqueue ``SAMPLES`` due-now jobs one at a time; return enqueue→start in seconds."""
    latencies = []
    for i in range(SAMPLES):
        tag = f"{prefix}-{i}"
        enqueued = timezone.now()
        stamp.delay(tag)
        log = wait_for(lambda tag=tag: _started(tag), timeout=15, what=worker.tail)
        latencies.append((log.started_at - enqueued).total_seconds())
        time.sleep(0.3)  # idle again
    return latencies


@pytest.mark.postgres
def test_listen_notify_worker_starts_a_due_now_job_well_under_the_poll_interval(tmp_path):
    name = app_name("wake")
    with processes(tmp_path, child_env(DEBOUNCE_TEST_APP_NAME=name)) as procs:
        worker = procs.worker("--poll-interval", POLL)
        _idle_listening(worker, "LISTEN/NOTIFY wake-up listening")
        # One connection that only listens, named apart from the worker's own.
        assert [state for _, state in pg_backends(f"{name}:wakeup")] == ["idle"]
        latencies = _due_now_latencies(worker, "now")
    median = statistics.median(latencies)
    print(
        f"\nLISTEN/NOTIFY, poll {POLL} s: due-now enqueue→start median {median * 1000:.1f} ms "
        f"(max {max(latencies) * 1000:.1f} ms, {SAMPLES} samples)"
    )
    assert max(latencies) < 1.0, latencies


@pytest.mark.postgres
def test_a_due_later_job_starts_at_its_run_at(tmp_path):
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--poll-interval", POLL)
        _idle_listening(worker, "LISTEN/NOTIFY wake-up listening")
        lateness = []
        for i in range(5):
            job = stamp.apply_async(args=[f"later-{i}"], countdown=0.8)
            log = wait_for(lambda i=i: _started(f"later-{i}"), timeout=15, what=worker.tail)
            lateness.append((log.started_at - job.run_at).total_seconds())
    median = statistics.median(lateness)
    print(
        f"\ndue in 0.8 s, poll {POLL} s: start - run_at median {median * 1000:.1f} ms "
        f"(max {max(lateness) * 1000:.1f} ms)"
    )
    assert all(late >= 0 for late in lateness), lateness  # never before its run_at
    assert max(lateness) < 0.5, lateness


def test_the_poll_backstop_sleeps_until_a_deadline_it_saw(tmp_path):
    """No wake-up at all: a job already in the table when the worker went idle starts on time."""
    # Due in 5 s, polled every 10: a worker that starts (under load, up to a few seconds)
    # and goes idle before the job is due must sleep until its run_at, not the poll's end.
    with processes(tmp_path, child_env(DEBOUNCE_TEST_WAKEUP="poll")) as procs:
        job = stamp.apply_async(args=["seen"], countdown=5)
        worker = procs.worker("--poll-interval", "10")
        wait_for(lambda: "wake-up: poll" in worker.stderr(), timeout=15, what=worker.tail)
        idle_at = timezone.now()
        log = wait_for(lambda: _started("seen"), timeout=20, what=worker.tail)
    assert idle_at < job.run_at, f"the worker took {idle_at - job.created_at} to start"
    late = (log.started_at - job.run_at).total_seconds()
    print(f"\npolling, poll 10 s: a job due in 5 s started {late * 1000:.1f} ms after run_at")
    assert 0 <= late < 0.5


# -- Redis -------------------------------------------------------------------------------------


@pytest.fixture
def private_redis():
    yield from running()


def _redis_settings(settings, url: str) -> None:
    """Make the test process publish where the worker listens (as the worker's settings do).

    ``DEBOUNCE_WAKEUP = "redis"`` on every database: meant for SQLite and MariaDB (no
    LISTEN/NOTIFY), it works on PostgreSQL too, where CI's slow cell runs these tests.
    """
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "wake": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        },
    }
    settings.DEBOUNCE_REDIS = "wake"
    settings.DEBOUNCE_WAKEUP = "redis"


def test_redis_wakeup_starts_a_due_now_job_well_under_the_poll_interval(
    tmp_path, private_redis, settings
):
    _redis_settings(settings, private_redis.url)
    env = child_env(DEBOUNCE_TEST_WAKE_REDIS_URL=private_redis.url, DEBOUNCE_TEST_WAKEUP="redis")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--poll-interval", POLL)
        _idle_listening(worker, "Redis wake-up listening")
        latencies = _due_now_latencies(worker, "redis")
    median = statistics.median(latencies)
    print(
        f"\nRedis wake-up ({connection.vendor}), poll {POLL} s: due-now enqueue→start "
        f"median {median * 1000:.1f} ms (max {max(latencies) * 1000:.1f} ms)"
    )
    assert max(latencies) < 1.0, latencies


@pytest.mark.slow
def test_redis_down_the_worker_polls_and_recovers(tmp_path, private_redis, settings):
    _redis_settings(settings, private_redis.url)
    env = child_env(DEBOUNCE_TEST_WAKE_REDIS_URL=private_redis.url, DEBOUNCE_TEST_WAKEUP="redis")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--poll-interval", "3")
        _idle_listening(worker, "Redis wake-up listening")
        private_redis.stop()
        wait_for(lambda: "Redis wake-up lost" in worker.stderr(), timeout=15, what=worker.tail)
        # Redis is down: enqueues still commit (the publish is skipped) and the worker polls.
        down = [stamp.delay(f"down-{i}") for i in range(5)]
        wait_for(
            lambda: CallLog.objects.filter(key__startswith="down-").count() == 5,
            timeout=20,
            what=worker.tail,
        )
        assert worker.alive(), worker.tail()
        assert worker.stderr().count("Redis wake-up lost") == 1  # logged once, not per retry
        private_redis.start()
        wait_for(lambda: "Redis wake-up is back" in worker.stderr(), timeout=40, what=worker.tail)
        time.sleep(PUBLISH_RETRY_AFTER)  # the publisher's pause after a failure has passed
        after = _due_now_latencies(worker, "back")
    runs = CallLog.objects.filter(key__startswith="down-").values_list("job_id", flat=True)
    assert sorted(runs) == sorted(job.pk for job in down)  # each ran once, none lost
    print(f"\nafter Redis came back: enqueue→start median {statistics.median(after) * 1000:.1f} ms")
    assert statistics.median(after) < 0.5, after  # polling every 3 s would give ~1.5 s
