"""Coalescing and payload merges under racing producer processes (§6 coalesce, §4.4, §4.8).

Producers are separate Python processes (``python -m tests.procs produce``)
released together by a barrier file, as in ``processes/test_enqueue_races.py``; workers are
``python -m django run_debounce_worker`` subprocesses. Nothing is mocked:
the unique ``unique_lock``/``window_key`` columns and the row locks of
PostgreSQL or MariaDB at READ COMMITTED decide every race.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import connections
from django.db.models import Count

from django_debounce.models import Job
from tests.conftest import child_env, run_burst
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_coalesce import ID_STRIDE

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

PRODUCERS = 8


def _calls(reports):
    """Every call of every producer, tagged with its producer number; no call may have failed."""
    assert [e for r in reports for e in r["other_errors"]] == []
    assert sum(r["contention"] for r in reports) == 0
    return [{**call, "producer": r["producer"]} for r in reports for call in r["calls"]]


def _call_id(call) -> int:
    return call["producer"] * ID_STRIDE + call["seq"]


def test_racing_producers_coalesce_into_one_job_per_key(tmp_path):
    """8 processes × 150 calls over 6 unique keys, no worker: 6 jobs, one created call each."""
    keys, calls_each = 6, 150
    with processes(tmp_path, child_env()) as procs:
        producers = procs.producers(PRODUCERS, task="coal.charge", keys=keys, calls=calls_each)
        calls = _calls(procs.producer_results(producers, timeout=180))
    assert len(calls) == PRODUCERS * calls_each

    jobs = list(Job.objects.all())
    assert len(jobs) == keys
    assert sorted(job.unique_key for job in jobs) == sorted(f"charge:k{i}" for i in range(keys))
    # Nothing moves on a coalesced call: still the first call's row, count 1, due at creation.
    for job in jobs:
        assert (job.status, job.enqueue_count, job.attempts) == (Job.Status.READY, 1, 0)
        assert job.run_at == job.created_at == job.last_enqueued_at
        assert job.opened_at is None and job.window_key is None
    by_key = {job.unique_key.split(":", 1)[1]: job for job in jobs}

    per_key = defaultdict(list)
    for call in calls:
        per_key[call["key"]].append(call)
    assert set(per_key) == set(by_key)
    for key, key_calls in per_key.items():
        job = by_key[key]
        assert {c["job_id"] for c in key_calls} == {job.pk}  # every return shares one id
        assert Counter(c["outcome"] for c in key_calls) == {
            "created": 1,
            "coalesced": len(key_calls) - 1,
        }
        assert {c["enqueue_count"] for c in key_calls} == {1}
        (creator,) = [c for c in key_calls if c["outcome"] == "created"]
        assert job.kwargs == {"producer": creator["producer"], "seq": creator["seq"]}
        assert job.args == [key]

    # The held jobs run once each, with the creating call's payload.
    run_burst()
    logs = list(CallLog.objects.filter(task="coal.charge"))
    assert sorted(log.job_id for log in logs) == sorted(job.pk for job in jobs)
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCESSFUL}


class PendingChecker(threading.Thread):
    """Sample the table every few ms: never two READY/RUNNING jobs of one coalescing key."""

    def __init__(self) -> None:
        super().__init__(name="pending-checker", daemon=True)
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                bad = list(
                    Job.objects.filter(
                        unique_key__isnull=False, status__in=[Job.Status.READY, Job.Status.RUNNING]
                    )
                    .values("task_name", "unique_key")
                    .annotate(pending=Count("id"))
                    .filter(pending__gt=1)
                )
                if bad:
                    self.violations.append(repr(bad))
                self.samples += 1
                time.sleep(0.003)
        finally:
            connections.close_all()


def test_racing_producers_and_a_worker_never_leave_two_pending_jobs_per_key(tmp_path):
    """With a live worker finishing jobs, a new job of a key is created only after the last
    one finished; a call coalesces into a READY or a RUNNING job; every job runs once."""
    keys, calls_each = 6, 150
    checker = PendingChecker()
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.02")
        checker.start()
        try:
            producers = procs.producers(
                PRODUCERS,
                task="coal.charge",
                keys=keys,
                calls=calls_each,
                pause_every=50,
                pause=0.1,
            )
            calls = _calls(procs.producer_results(producers, timeout=240))

            def drained() -> bool:
                assert worker.alive(), worker.tail()
                return not Job.objects.filter(
                    status__in=[Job.Status.READY, Job.Status.RUNNING]
                ).exists()

            wait_for(drained, timeout=90, interval=0.1, what="the worker to run every job")
        finally:
            checker.stop.set()
            checker.join(timeout=10)
    assert checker.samples > 20
    assert checker.violations == []
    jobs = {job.pk: job for job in Job.objects.all()}
    assert {job.status for job in jobs.values()} == {Job.Status.SUCCESSFUL}
    assert all(job.attempts == 1 and job.enqueue_count == 1 for job in jobs.values())
    assert {call["job_id"] for call in calls} == set(jobs)
    outcomes = Counter(call["outcome"] for call in calls)
    assert outcomes["created"] == len(jobs)
    assert outcomes["coalesced"] == len(calls) - len(jobs) > 0
    for call in calls:
        assert jobs[call["job_id"]].unique_key == f"charge:{call['key']}"
    runs = Counter(CallLog.objects.filter(task="coal.charge").values_list("job_id", flat=True))
    assert runs == dict.fromkeys(jobs, 1)
    # Runs of one key never overlapped: a key's next job existed only after the last finished.
    per_key = defaultdict(list)
    for log in CallLog.objects.filter(task="coal.charge"):
        per_key[log.key].append(log)
    for logs in per_key.values():
        logs.sort(key=lambda log: log.started_at)
        for earlier, later in zip(logs, logs[1:], strict=False):
            assert earlier.finished_at <= later.started_at


def test_racing_producers_merge_every_id_into_one_window(tmp_path):
    """8 processes × 150 calls, each with a distinct id, into one key's window with a union
    merge and no worker: one job, 1,200 counted calls, and its run receives every id once."""
    calls_each = 150
    with processes(tmp_path, child_env()) as procs:
        producers = procs.producers(PRODUCERS, task="coal.gather", keys=1, calls=calls_each)
        calls = _calls(procs.producer_results(producers, timeout=180))
    total = PRODUCERS * calls_each
    assert len(calls) == total
    (job,) = Job.objects.all()
    assert (job.debounce_key, job.status, job.enqueue_count) == (
        "gather:k0",
        Job.Status.READY,
        total,
    )
    assert {call["job_id"] for call in calls} == {job.pk}
    assert Counter(call["outcome"] for call in calls) == {"created": 1, "debounced": total - 1}
    # Each merge ran under the row lock: every call saw a distinct count.
    assert sorted(call["enqueue_count"] for call in calls) == list(range(1, total + 1))
    expected = sorted(_call_id(call) for call in calls)
    assert len(set(expected)) == total
    assert job.args == ["k0"] and job.kwargs == {"ids": expected}

    wait_for(lambda: Job.objects.due().exists(), timeout=10, what="the window to fall due")
    run_burst()
    (log,) = CallLog.objects.filter(task="coal.gather")
    assert log.job_id == job.pk
    assert log.payload["ids"] == expected
    assert (log.payload["calls_collapsed"], log.payload["attempt"]) == (total - 1, 1)
    assert Job.objects.get().result == total


@pytest.mark.slow
def test_racing_producers_merge_with_a_live_worker_lose_no_id(tmp_path):
    """Producers race a worker closing 200 ms windows of one key: every id reaches exactly one
    run, the run of the window its call joined."""
    calls_each = 150
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.02")
        producers = procs.producers(
            PRODUCERS, task="coal.gather", keys=1, calls=calls_each, pause_every=30, pause=0.3
        )
        calls = _calls(procs.producer_results(producers, timeout=240))

        def drained() -> bool:
            assert worker.alive(), worker.tail()
            return not Job.objects.filter(
                status__in=[Job.Status.READY, Job.Status.RUNNING]
            ).exists()

        wait_for(drained, timeout=90, interval=0.1, what="the worker to run every window")
    jobs = {job.pk: job for job in Job.objects.all()}
    assert len(jobs) > 1  # the worker closed windows while calls kept coming
    assert {job.status for job in jobs.values()} == {Job.Status.SUCCESSFUL}
    logs = list(CallLog.objects.filter(task="coal.gather"))
    assert sorted(log.job_id for log in logs) == sorted(jobs)  # one run per window
    received = [i for log in logs for i in log.payload["ids"]]
    assert sorted(received) == sorted(_call_id(call) for call in calls)  # each id exactly once
    ids_by_job = {log.job_id: set(log.payload["ids"]) for log in logs}
    for call in calls:
        assert _call_id(call) in ids_by_job[call["job_id"]]
    for log in logs:
        assert log.payload["calls_collapsed"] == jobs[log.job_id].enqueue_count - 1
        assert len(log.payload["ids"]) == jobs[log.job_id].enqueue_count
