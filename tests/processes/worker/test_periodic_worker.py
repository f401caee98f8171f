"""Real worker processes defer and run a periodic task: one job per tick (decision 177)."""

from __future__ import annotations

import signal

import pytest

from django_debounce.models import Job, PeriodicTick
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_run_each_tick_of_a_schedule_once(tmp_path):
    env = child_env(DEBOUNCE_TEST_PERIODIC="1", DEBOUNCE_POLL_INTERVAL="0.2")
    with processes(tmp_path, env) as procs:
        workers = [procs.worker("--concurrency", "2", name=f"w{i}") for i in range(2)]
        wait_for(
            lambda: CallLog.objects.filter(task="per.every_second").count() >= 3,
            timeout=30,
            what=procs.tails,
        )
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(30) == 0, procs.tails()
    ticks = list(PeriodicTick.objects.values_list("tick", "job_id", "outcome"))
    jobs = Job.objects.filter(task_name="per.every_second")
    logged = list(CallLog.objects.filter(task="per.every_second").values_list("key", flat=True))
    # One job per tick row, each tick logged once, whichever worker won it.
    assert {job_id for _, job_id, _ in ticks if job_id} == set(jobs.values_list("pk", flat=True))
    assert len(logged) == len(set(logged)) >= 3
    deferred = {tick.isoformat() for tick, job_id, _ in ticks if job_id}
    assert set(logged) <= deferred
    assert {o for _, _, o in ticks} <= {"created", "overlap"}
