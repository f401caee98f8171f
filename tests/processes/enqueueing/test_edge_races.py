"""Leading and both edges raced by real producer processes while a worker runs (decision 180).

Four producers (``python -m tests.procs produce``) call a 200 ms window with a
1 s max wait over three keys, pausing now and then so bursts close and new
ones open, while ``run_debounce_worker`` claims and runs. Nothing is mocked.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from django.db.models import Sum

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PRODUCERS = 4
CALLS = 120
KEYS = 3


@pytest.mark.parametrize(("task", "per_burst"), [("rel.edge_leading", 1), ("rel.edge_both", 2)])
def test_racing_producers_give_one_leading_job_per_burst_and_runs_never_overlap(
    tmp_path, task, per_burst
):
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        producers = procs.producers(
            PRODUCERS, task=task, keys=KEYS, calls=CALLS, pause_every=20, pause=0.4
        )
        reports = procs.producer_results(producers, timeout=240)

        def drained() -> bool:
            assert worker.alive(), worker.tail()
            return not Job.objects.filter(status__in=["READY", "RUNNING"]).exists()

        wait_for(drained, timeout=60, interval=0.1, what="the worker to run every burst")
    calls = [call for report in reports for call in report["calls"]]
    assert [e for r in reports for e in r["other_errors"]] == []
    served = [call for call in calls if "error" not in call]
    contention = len(calls) - len(served)
    print(f"\n[edges] {task}: {len(calls)} calls, {contention} EnqueueContentionError")
    assert contention <= len(calls) // 100  # retried within the budget, nearly always

    jobs = list(Job.objects.filter(task_name=task).order_by("pk"))
    assert {job.status for job in jobs} == {Job.Status.SUCCESSFUL}
    # Every served call is counted once, on the job it returned.
    assert Job.objects.filter(task_name=task).aggregate(n=Sum("enqueue_count"))["n"] == len(served)
    assert {call["job_id"] for call in served} <= {job.pk for job in jobs}
    # Each job ran once; runs of one key never overlap (§4.5).
    runs = list(CallLog.objects.filter(task=task).order_by("started_at"))
    assert Counter(run.job_id for run in runs) == Counter({job.pk: 1 for job in jobs})
    by_key = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    for key, key_runs in by_key.items():
        for before, after in zip(key_runs, key_runs[1:], strict=False):
            assert before.finished_at <= after.started_at, (key, before.job_id, after.job_id)
    # A burst (its opening and ceiling) has one leading job, due when it opened, and at
    # most one trailing job; there were many bursts.
    bursts = defaultdict(list)
    for job in jobs:
        bursts[(job.debounce_key, job.opened_at, job.max_run_at)].append(job)
    for rows in bursts.values():
        assert 1 <= len(rows) <= per_burst, rows
        assert rows[0].run_at == rows[0].opened_at
        shown = [(r.pk, r.run_at, r.opened_at, r.max_run_at, r.enqueue_count) for r in rows]
        assert all(row.run_at > row.opened_at for row in rows[1:]), shown
    assert len(bursts) >= KEYS * 2
