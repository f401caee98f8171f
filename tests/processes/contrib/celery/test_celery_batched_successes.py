"""Batched successes in a real ``celery worker``: what a kill and a warm shutdown do (decisions 215-216).

``DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 10`` in the worker keeps each success waiting for
its write long enough to stop the worker meanwhile; the lease is 3 s, renewed while a
success waits. A SIGKILL loses the waiting successes, so the jobs run again once their
leases lapse (at least once, §7); a live worker's waiting successes keep their leases;
a warm shutdown (SIGTERM) writes them before the process exits, so they ran once.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator

import pytest

from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.models import Job
from tests.processes.celery_rig import CeleryRig
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery import record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

Status = Job.Status


@pytest.fixture
def rig(tmp_path, settings) -> Iterator[CeleryRig]:
    with processes(tmp_path, {}) as procs:
        built = CeleryRig(
            "redis", procs, DEBOUNCE_TEST_LEASE="3s", DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL="10"
        )
        for name, value in built.settings().items():
            setattr(settings, name, value)
        yield built
        procs.kill_all()
        built.close()


def _returned(worker, ids: list[int]) -> bool:
    """True once the worker logged each job's Celery task as succeeded (the body returned)."""
    done = set(re.findall(r"django_debounce\.run_job\[(\d+)\] succeeded", worker.stderr()))
    return {str(pk) for pk in ids} <= done


def test_a_killed_worker_loses_its_waiting_successes_and_the_jobs_run_again(
    rig: CeleryRig,
) -> None:
    jobs = [record.delay(f"killed-{n}") for n in range(3)]
    ids = [job.pk for job in jobs]
    first = rig.worker()
    assert celery_executor.dispatch_due(app=rig.app) == 3
    wait_for(lambda: _returned(first, ids), timeout=60, what=first.tail)
    assert Job.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 3, "waiting"
    first.send(signal.SIGKILL)
    first.wait(10)
    second = rig.worker()

    def ran_again() -> bool:
        celery_executor.dispatch_due(app=rig.app)  # reclaims the lapsed leases, hands off again
        return Job.objects.filter(pk__in=ids, status=Status.SUCCESSFUL).count() == 3

    wait_for(ran_again, timeout=90, interval=0.3, what=second.tail)
    rows = Job.objects.filter(pk__in=ids)
    assert sorted(rows.values_list("attempts", flat=True)) == [2, 2, 2]
    assert sorted(rows.values_list("result__pid", flat=True)) == [second.pid] * 3
    runs = CallLog.objects.filter(task="cel.record", key__startswith="killed-")
    assert sorted(runs.values_list("pid", flat=True)) == sorted([first.pid] * 3 + [second.pid] * 3)


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_warm_shutdown_writes_the_waiting_successes_before_the_worker_exits(
    rig: CeleryRig, pool: str
) -> None:
    jobs = [record.delay(f"warm-{pool}-{n}") for n in range(4)]
    ids = [job.pk for job in jobs]
    worker = rig.worker("--concurrency=2", pool=pool)
    assert celery_executor.dispatch_due(app=rig.app) == 4
    wait_for(lambda: _returned(worker, ids), timeout=60, what=worker.tail)
    assert Job.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 4, "waiting"
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.tail()
    rows = Job.objects.filter(pk__in=ids)
    assert sorted(rows.values_list("status", "attempts")) == [(Status.SUCCESSFUL, 1)] * 4
    assert CallLog.objects.filter(task="cel.record", key__startswith="warm-").count() == 4
