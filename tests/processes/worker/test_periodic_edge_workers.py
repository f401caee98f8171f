"""Two real worker processes (prefetch on) defer the ticks of a both-edge periodic task (attack).

Every second a tick; window 2 s, max wait 4 s, one key, no overlap: each tick
is deferred once, whichever worker wins it, runs of the key never overlap, and
no worker logs an error (decisions 177-180).
"""

from __future__ import annotations

import signal

import pytest

from django_debounce.models import Job, PeriodicTick
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.slow, pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

NAME = "per.both_every_second"


def test_two_workers_defer_a_both_edge_schedule_once_per_tick_without_overlap(tmp_path):
    env = child_env(
        DEBOUNCE_TEST_PERIODIC_EDGE="1", DEBOUNCE_POLL_INTERVAL="0.2", DEBOUNCE_TEST_PREFETCH="4"
    )
    with processes(tmp_path, env) as procs:
        workers = [procs.worker("--concurrency", "2", name=f"w{i}") for i in range(2)]
        wait_for(
            lambda: PeriodicTick.objects.filter(schedule=NAME).count() >= 7,
            timeout=40,
            what=procs.tails,
        )
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(30) == 0, procs.tails()
        stderr = procs.tails()
    assert "Traceback" not in stderr and "could not be deferred" not in stderr, stderr
    ticks = list(PeriodicTick.objects.filter(schedule=NAME).order_by("tick"))
    assert len({t.tick for t in ticks}) == len(ticks)
    print("\n[periodic both]", [(t.tick.second, t.outcome, t.deferred_by) for t in ticks])
    outcomes = {t.outcome for t in ticks}
    assert outcomes <= {"created", "debounced", "overlap"} and "created" in outcomes
    assert {t.job_id for t in ticks if t.job_id} <= set(
        Job.objects.filter(task_name=NAME).values_list("pk", flat=True)
    )
    runs = list(CallLog.objects.filter(task=NAME).order_by("started_at"))
    assert runs
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier.finished_at is not None and earlier.finished_at <= later.started_at
