"""Flow control across real worker processes on a server database: PostgreSQL or MariaDB (§6, §7).

Two ``run_debounce_worker`` subprocesses with four threads each share one
token bucket, one concurrency count and one circuit breaker through the
TaskState rows they lock in their claim transactions. Runs are timed from the
CallLog rows the tasks write (start and finish instants, wall clock).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_debounce import registry
from django_debounce.models import DeadLetter, Job, TaskState
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp import tasks_flow
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

WORKER = ("--concurrency", "4", "--poll-interval", "0.05")


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def env() -> dict[str, str]:
    return child_env(DEBOUNCE_FLOW_TASKS="1")


def most_in_one_second(instants: list[datetime]) -> int:
    """The most instants any half-open interval [t, t + 1 s) holds."""
    ordered = sorted(instants)
    best = 0
    j = 0
    for i, start in enumerate(ordered):
        while j < len(ordered) and ordered[j] < start + timedelta(seconds=1):
            j += 1
        best = max(best, j - i)
    return best


def most_overlapping(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = best = 0
    for _, delta in events:  # at equal instants an end (-1) sorts before a start (+1)
        running += delta
        best = max(best, running)
    return best


def test_rate_limit_holds_across_two_worker_processes(tmp_path, flow):
    """100 jobs at "10/s" on 2 processes × 4 threads: ≤ 20 starts in any second, ≥ 9 s in all."""
    with processes(tmp_path, env()) as procs:
        workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
        # Both processes up before the jobs exist: a slow start-up of one must not leave
        # every token to the other (both must take part, below).
        wait_for(
            lambda: all("starting" in worker.stderr() for worker in workers),
            timeout=60,
            what=lambda: f"both workers to start\n{procs.tails()}",
        )
        jobs = [flow["flow.rate"].delay(f"r{i:03}", 0.02) for i in range(100)]
        wait_for(
            lambda: CallLog.objects.filter(task="flow.rate").count() == 100,
            timeout=90,
            what=lambda: f"100 runs\n{procs.tails()}",
        )
        wait_for(
            lambda: (
                Job.objects.filter(task_name="flow.rate", status=Job.Status.SUCCESSFUL).count()
                == 100
            ),
            timeout=30,
            what="100 outcomes",
        )
        assert all(worker.alive() for worker in workers)
    logs = list(CallLog.objects.filter(task="flow.rate"))
    starts = [log.started_at for log in logs]
    claims = [job.started_at for job in Job.objects.filter(pk__in=[job.pk for job in jobs])]
    span = (max(starts) - min(starts)).total_seconds()
    claim_span = (max(claims) - min(claims)).total_seconds()
    print(
        f"\n[throttle] 100 runs over {span:.2f}s (claims over {claim_span:.3f}s); most starts "
        f"in 1s: {most_in_one_second(starts)} (claims: {most_in_one_second(claims)})"
    )
    assert len({log.key for log in logs}) == 100
    assert len({log.pid for log in logs}) == 2  # both processes took part
    assert most_in_one_second(claims) <= 20  # capacity 10 + 10 refilled in one second
    # Job.started_at is the claim, where the bucket acts: 10 at once, then 90 at 10/s.
    assert claim_span >= 9.0
    # The function starts after its claim, a few ms later, and on a loaded machine up to a few
    # hundred ms, not always the same delay: allow 0.5 s of that jitter (5 more tokens' worth).
    assert most_in_one_second(starts) <= 20 + 5
    assert span >= 9.0 - 0.5
    assert DeadLetter.objects.count() == 0


def test_drop_under_a_burst_sheds_the_excess_across_processes(tmp_path, flow):
    jobs = [
        flow["flow.rate_drop"].apply_async(args=(f"d{i:03}",), metadata={"i": i})
        for i in range(100)
    ]
    pending = Job.objects.filter(
        task_name="flow.rate_drop", status__in=[Job.Status.READY, Job.Status.RUNNING]
    )
    with processes(tmp_path, env()) as procs:
        for i in range(2):
            procs.worker(*WORKER, name=f"worker-{i}")
        wait_for(
            lambda: not pending.exists(), timeout=60, what=lambda: f"the burst\n{procs.tails()}"
        )
        executed = list(Job.objects.filter(task_name="flow.rate_drop", status="SUCCESSFUL"))
        signal_rows = CallLog.objects.filter(task__startswith="signal:")
        # A run's job_finished receiver writes its row after the outcome write that ended the
        # wait above: wait for the row of every executed job, not for a fixed time.
        wait_for(
            lambda: signal_rows.count() >= len(executed),
            timeout=30,
            what=lambda: f"the signal rows of the last runs\n{procs.tails()}",
        )
        shed = list(Job.objects.filter(task_name="flow.rate_drop", status=Job.Status.SHED))
        print(f"\n[drop] executed {len(executed)}, shed {len(shed)}")
        assert len(executed) + len(shed) == 100
        assert len(executed) >= 10 and len(shed) >= 50
        assert CallLog.objects.filter(task="flow.rate_drop").count() == len(executed)
        letters = {letter.job_id: letter for letter in DeadLetter.objects.all()}
        assert set(letters) == {job.pk for job in shed}
        for job in shed:
            assert job.attempts == 0 and job.metadata == {"i": int(job.args[0][1:])}
            assert letters[job.pk].reason == "shed: rate limit 10/s exceeded"
            assert letters[job.pk].metadata["shed"] is True
        signalled = set(signal_rows.values_list("job_id", flat=True))
        assert signalled == {job.pk for job in executed}  # none for a shed job

        retried = letters[shed[0].pk].retry()
        assert retried is not None and retried.pk not in {job.pk for job in jobs}
        wait_for(
            lambda: Job.objects.get(pk=retried.pk).status == Job.Status.SUCCESSFUL,
            timeout=30,
            what=lambda: f"the manual retry of a shed entry\n{procs.tails()}",
        )


def test_concurrency_cap_holds_across_two_worker_processes(tmp_path, flow):
    for i in range(12):
        flow["flow.capped"].delay(f"c{i:02}", 0.3)
    with processes(tmp_path, env()) as procs:
        for i in range(2):
            procs.worker(*WORKER, name=f"worker-{i}")
        wait_for(
            lambda: (
                CallLog.objects.filter(task="flow.capped", finished_at__isnull=False).count() == 12
            ),
            timeout=90,
            what=lambda: f"12 runs\n{procs.tails()}",
        )
    logs = list(CallLog.objects.filter(task="flow.capped"))
    assert len({log.key for log in logs}) == 12
    assert most_overlapping([(log.started_at, log.finished_at) for log in logs]) == 2


def test_two_worker_processes_share_one_breaker(tmp_path, flow):
    for i in range(3):
        flow["flow.guarded"].delay(f"bad{i}", fail=True)
    with processes(tmp_path, env()) as procs:
        workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
        wait_for(
            lambda: Job.objects.filter(task_name="flow.guarded", status="FAILED").count() == 3,
            timeout=60,
            what=lambda: f"3 failures\n{procs.tails()}",
        )
        state = TaskState.objects.get(task_name="flow.guarded")
        assert (state.breaker_state, state.failures) == ("open", 3)
        waiting = [flow["flow.guarded"].delay(f"ok{i}") for i in range(6)]
        time.sleep(3)  # both workers poll every 50 ms meanwhile
        assert all(worker.alive() for worker in workers)
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.READY, 0)
    assert not CallLog.objects.filter(task="flow.guarded", key__startswith="ok").exists()
