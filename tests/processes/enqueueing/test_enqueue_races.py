"""Races between real producer processes, and between producers and a running worker (§4.4, §4.5).

Producers are separate Python processes (``python -m tests.procs produce``)
released together by a barrier file; the worker is ``python -m django
run_debounce_worker``. Nothing here is mocked: the database's own locks and
the unique ``window_key`` column decide every race.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.db.models import Count, Q, Sum

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

PRODUCERS = 8
CALLS = 300
KEYS = 20


def _all_calls(reports):
    """Every call of every producer, tagged with its producer number."""
    return [
        {**call, "producer": report["producer"]} for report in reports for call in report["calls"]
    ]


@pytest.mark.slow
def test_parallel_producers_leave_one_window_per_key(tmp_path):
    """8 processes × 300 calls over 20 keys of a 1h window: 20 rows, 2,400 counted calls."""
    started = time.monotonic()
    with processes(tmp_path, child_env()) as procs:
        producers = procs.producers(PRODUCERS, task="rel.hold", keys=KEYS, calls=CALLS)
        reports = procs.producer_results(producers, timeout=240)
    elapsed = time.monotonic() - started
    calls = _all_calls(reports)
    contention = sum(r["contention"] for r in reports)
    other = [e for r in reports for e in r["other_errors"]]
    print(
        f"\n[races] {len(calls)} calls from {PRODUCERS} processes in {elapsed:.1f}s; "
        f"EnqueueContentionError: {contention}; other errors: {len(other)}"
    )
    assert other == []
    assert contention == 0
    assert len(calls) == PRODUCERS * CALLS

    jobs = list(Job.objects.all())
    assert len(jobs) == KEYS
    assert {job.status for job in jobs} == {Job.Status.READY}
    assert all(job.is_open_window and job.attempts == 0 for job in jobs)
    assert sorted(job.debounce_key for job in jobs) == sorted(f"hold:k{i}" for i in range(KEYS))
    assert sum(job.enqueue_count for job in jobs) == PRODUCERS * CALLS
    assert CallLog.objects.count() == 0  # nothing was due, nothing ran

    # Every call got the one row of its key; exactly one call per key created it.
    by_key = {job.debounce_key.split(":", 1)[1]: job for job in jobs}
    for call in calls:
        assert call["job_id"] == by_key[call["key"]].pk
    outcomes = Counter(call["outcome"] for call in calls)
    assert outcomes == {"created": KEYS, "debounced": PRODUCERS * CALLS - KEYS}
    per_key_calls = Counter(call["key"] for call in calls)
    for key, job in by_key.items():
        assert job.enqueue_count == per_key_calls[key]
        # enqueue_count is taken under the row lock: every call saw a distinct value.
        seen = sorted(c["enqueue_count"] for c in calls if c["key"] == key)
        assert seen == list(range(1, per_key_calls[key] + 1))
        assert job.run_at == job.last_enqueued_at + timedelta(hours=1)
        assert job.max_run_at == job.opened_at + timedelta(hours=2)


class WindowChecker(threading.Thread):
    """Poll the table every few milliseconds; record any state that breaks §4.4/§4.5."""

    def __init__(self) -> None:
        super().__init__(name="window-checker", daemon=True)
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                per_key = (
                    Job.objects.filter(key_hash__isnull=False)
                    .values("key_hash")
                    .annotate(
                        open_windows=Count(
                            "id", filter=Q(status=Job.Status.READY, window_key__isnull=False)
                        ),
                        never_claimed=Count("id", filter=Q(status=Job.Status.READY, attempts=0)),
                        running=Count("id", filter=Q(status=Job.Status.RUNNING)),
                    )
                    .filter(Q(open_windows__gt=1) | Q(never_claimed__gt=1) | Q(running__gt=1))
                )
                bad = list(per_key)
                if bad:
                    self.violations.append(repr(bad))
                self.samples += 1
                time.sleep(0.003)
        finally:
            connections.close_all()


@pytest.mark.slow
def test_producers_racing_a_worker_run_every_window_once(tmp_path):
    """Producers race a live worker on 200ms/1s windows: one open window per key, every
    window runs exactly once with its last call's payload, runs of a key never overlap."""
    checker = WindowChecker()
    started = time.monotonic()
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "4", "--poll-interval", "0.05")
        checker.start()
        try:
            producers = procs.producers(
                PRODUCERS, task="rel.race", keys=KEYS, calls=CALLS, pause_every=60, pause=0.4
            )
            reports = procs.producer_results(producers, timeout=240)
            produced = time.monotonic() - started

            def drained() -> bool:
                assert worker.alive(), worker.tail()
                return not Job.objects.filter(
                    status__in=[Job.Status.READY, Job.Status.RUNNING]
                ).exists()

            wait_for(drained, timeout=60, interval=0.1, what="the worker to drain every window")
        finally:
            checker.stop.set()
            checker.join(timeout=10)
        assert worker.alive(), worker.tail()
    calls = _all_calls(reports)
    contention = sum(r["contention"] for r in reports)
    other = [e for r in reports for e in r["other_errors"]]
    jobs = {job.pk: job for job in Job.objects.all()}
    logs = list(CallLog.objects.filter(task="rel.race"))
    print(
        f"\n[races+worker] {len(calls)} calls in {produced:.1f}s -> {len(jobs)} windows run; "
        f"checker samples: {checker.samples}; EnqueueContentionError: {contention}"
    )
    assert other == []
    assert contention == 0
    assert checker.samples > 50
    assert checker.violations == []

    # Every window ran exactly once, successfully.
    assert {job.status for job in jobs.values()} == {Job.Status.SUCCESSFUL}
    assert all(job.attempts == 1 for job in jobs.values())
    run_ids = [log.job_id for log in logs]
    assert len(run_ids) == len(set(run_ids)) == len(jobs)
    assert set(run_ids) == set(jobs)
    assert sum(job.enqueue_count for job in jobs.values()) == PRODUCERS * CALLS
    assert {call["job_id"] for call in calls} == set(jobs)  # no call went to an unknown job

    # Each job ran with the payload of the last call that joined it (replace payload):
    # enqueue_count is assigned under the row lock, so the call holding the job's final
    # count wrote last.
    log_by_job = {log.job_id: log for log in logs}
    last_call: dict[int, dict] = {}
    for call in calls:
        current = last_call.get(call["job_id"])
        if current is None or call["enqueue_count"] > current["enqueue_count"]:
            last_call[call["job_id"]] = call
    for job_id, job in jobs.items():
        call = last_call[job_id]
        assert call["enqueue_count"] == job.enqueue_count
        log = log_by_job[job_id]
        assert log.key == call["key"]
        assert log.payload == {"producer": call["producer"], "seq": call["seq"]}
        # A call joins only a window no worker has claimed: the run starts after it began.
        assert log.started_at >= datetime.fromtimestamp(call["before"], tz=UTC)

    # Each key's last call ran, after that call.
    for key in {call["key"] for call in calls}:
        latest = max((c for c in calls if c["key"] == key), key=lambda c: c["before"])
        log = log_by_job[latest["job_id"]]
        assert log.started_at >= datetime.fromtimestamp(latest["before"], tz=UTC)

    # Runs of one key never overlap (§4.5).
    per_key: dict[str, list[CallLog]] = defaultdict(list)
    for log in logs:
        per_key[log.key].append(log)
    for key, runs in per_key.items():
        runs.sort(key=lambda log: log.started_at)
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert earlier.finished_at <= later.started_at, (key, earlier.job_id, later.job_id)

    assert Job.objects.aggregate(total=Sum("enqueue_count"))["total"] == PRODUCERS * CALLS
