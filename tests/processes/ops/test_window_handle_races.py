"""Window handles racing real producers and a worker (issue #21 item 1; §4.4, §4.5).

Producers (``python -m tests.procs produce``) enqueue ``rel.race`` calls (200 ms
window, 1 s max wait, newest payload) over three keys while a driver process
(``tests/processes/ops/window_driver.py``) flushes and cancels their windows from
code, through single handles and the bulk form, and ``run_debounce_worker`` claims
and runs them. Nothing is mocked: the rows' locks decide every race.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest

from django_debounce.models import Job
from django_debounce.ops import edge_runs
from tests.conftest import child_env
from tests.processes.enqueueing.test_enqueue_races import WindowChecker
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

PRODUCERS = 4
CALLS = 150
KEYS = 3


def test_flush_and_cancel_from_code_race_producers_and_a_worker(tmp_path):
    """Every call ends in a job that ran once or in a job the driver cancelled, counted
    there; never two open windows for a key; a claimed job is never cancelled; every
    ``inspect()`` meanwhile returned one consistent row."""
    checker = WindowChecker()
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        stop = tmp_path / "stop"
        driver = procs.start(
            "driver",
            [
                "-m",
                "tests.processes.ops.window_driver",
                f"--keys={KEYS}",
                "--seed=21",
                f"--ready={tmp_path / 'driver-ready'}",
                f"--go={tmp_path / 'go'}",  # the producers' barrier: all start together
                f"--stop={stop}",
                f"--out={tmp_path / 'driver.json'}",
            ],
        )
        wait_for(
            lambda: (tmp_path / "driver-ready").exists() or not driver.alive(),
            timeout=60,
            what="the driver to connect",
        )
        assert driver.alive(), driver.tail()
        checker.start()
        try:
            producers = procs.producers(
                PRODUCERS, task="rel.race", keys=KEYS, calls=CALLS, pause_every=25, pause=0.3
            )
            reports = procs.producer_results(producers, timeout=240)
            stop.touch()
            assert driver.wait(60) == 0, driver.tail()

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
        driven = json.loads((tmp_path / "driver.json").read_text())

    calls = [
        {**call, "producer": report["producer"]} for report in reports for call in report["calls"]
    ]
    actions = driven["actions"]
    jobs = {job.pk: job for job in Job.objects.all()}
    logs = list(CallLog.objects.filter(task="rel.race"))
    tally = Counter((a["op"], a["reason"]) for a in actions)
    ran = [pk for pk, job in jobs.items() if job.status == Job.Status.SUCCESSFUL]
    cancelled = [pk for pk, job in jobs.items() if job.status == Job.Status.CANCELLED]
    print(
        f"\n[window handles] {len(calls)} calls -> {len(jobs)} jobs: {len(ran)} ran, "
        f"{len(cancelled)} cancelled; driver: {dict(sorted(tally.items()))}; "
        f"retries after lock contention: {len(driven['retries'])}; "
        f"checker samples: {checker.samples}"
    )
    assert [e for r in reports for e in r["other_errors"]] == []
    assert sum(r["contention"] for r in reports) == 0
    assert driven["errors"] == []
    assert checker.samples > 50
    assert checker.violations == []  # never two open windows (or two runs) for a key
    assert tally[("flush", "flushed")] > 0 and tally[("cancel", "cancelled")] > 0

    # Every call is in a job that ran or in a job that was cancelled, and counted there.
    assert {job.status for job in jobs.values()} <= {Job.Status.SUCCESSFUL, Job.Status.CANCELLED}
    assert {call["job_id"] for call in calls} == set(jobs)
    per_job = Counter(call["job_id"] for call in calls)
    assert {pk: job.enqueue_count for pk, job in jobs.items()} == dict(per_job)

    # Each job that ran ran once, with its last call's payload; a cancelled one never ran.
    run_ids = Counter(log.job_id for log in logs)
    assert set(run_ids) == set(ran) and set(run_ids.values()) == {1}
    log_by_job = {log.job_id: log for log in logs}
    for pk in ran:
        latest = max((c for c in calls if c["job_id"] == pk), key=lambda c: c["enqueue_count"])
        assert log_by_job[pk].payload == {"producer": latest["producer"], "seq": latest["seq"]}
        assert log_by_job[pk].started_at >= datetime.fromtimestamp(latest["before"], tz=UTC)

    # The driver cancelled exactly the cancelled jobs, and reported what it cancelled:
    # their calls then were all their calls (no call joined a cancelled window).
    done_cancels = [a for a in actions if a["op"] == "cancel" and a["done"]]
    assert sorted(a["job_id"] for a in done_cancels) == sorted(cancelled)
    for action in done_cancels:
        assert action["status"] == "CANCELLED" and action["dependents"] == []
        assert action["calls"] == jobs[action["job_id"]].enqueue_count
    # A job reported as claimed was left alone: it ran.
    claimed = {a["job_id"] for a in actions if a["reason"] == "claimed"}
    assert {jobs[pk].status for pk in claimed} <= {Job.Status.SUCCESSFUL}
    # A flushed window was either run or cancelled later; never lost.
    flushed = {a["job_id"] for a in actions if a["reason"] == "flushed"}
    assert flushed <= set(jobs)

    # inspect() racing the same: each state it returned is one consistent row. Its payload is
    # the call that brought the job to the count it reported (newest payload), its times are
    # in order, an open window was READY, a running one RUNNING and then ran, and after a
    # cancel returned no later inspect saw that job open (the driver acts in sequence).
    seen = [a for a in actions if a["op"] == "inspect"]
    assert len(seen) > 20 and any(a["open"] for a in seen)
    by_count = {(c["job_id"], c["enqueue_count"]): c for c in calls}
    for state in seen:
        call = by_count[(state["job_id"], state["calls"])]
        assert state["payload"] == {"producer": call["producer"], "seq": call["seq"]}, state
        assert state["in_order"] and state["key"] == f"race:{call['key']}", state
        if state["open"]:
            assert state["status"] == "READY", state
        if state["running"]:
            assert state["status"] == "RUNNING" and jobs[state["job_id"]].status == "SUCCESSFUL"
    cancel_ids = {id(a) for a in done_cancels}
    cancelled_at = {a["job_id"]: n for n, a in enumerate(actions) if id(a) in cancel_ids}
    for n, state in enumerate(actions):
        if state["op"] == "inspect" and state["open"] and state["job_id"] in cancelled_at:
            assert n < cancelled_at[state["job_id"]], state

    # Runs of one key never overlap (§4.5).
    per_key: dict[str, list[CallLog]] = defaultdict(list)
    for log in logs:
        per_key[log.key].append(log)
    for key, runs in per_key.items():
        runs.sort(key=lambda log: log.started_at)
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert earlier.finished_at <= later.started_at, (key, earlier.job_id, later.job_id)


@pytest.mark.slow
def test_window_handles_of_a_both_edge_task_race_producers_and_a_worker(tmp_path):
    """The same race on ``rel.edge_both`` (decisions 180, 181, 197): every job ran once or
    was cancelled; a burst's rows are its leading job then trailing jobs, each after the
    one before ran; every ``inspect()`` returned one consistent row."""
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        stop = tmp_path / "stop"
        driver = procs.start(
            "driver",
            [
                "-m",
                "tests.processes.ops.window_driver",
                "--task=rel.edge_both",
                f"--keys={KEYS}",
                "--seed=22",
                f"--ready={tmp_path / 'driver-ready'}",
                f"--go={tmp_path / 'go'}",
                f"--stop={stop}",
                f"--out={tmp_path / 'driver.json'}",
            ],
        )
        wait_for(
            lambda: (tmp_path / "driver-ready").exists() or not driver.alive(),
            timeout=60,
            what="the driver to connect",
        )
        producers = procs.producers(
            PRODUCERS, task="rel.edge_both", keys=KEYS, calls=CALLS, pause_every=25, pause=0.3
        )
        reports = procs.producer_results(producers, timeout=240)
        stop.touch()
        assert driver.wait(60) == 0, driver.tail()
        wait_for(
            lambda: not Job.objects.filter(status__in=["READY", "RUNNING"]).exists(),
            timeout=60,
            interval=0.1,
            what="the worker to drain every burst",
        )
        assert worker.alive(), worker.tail()
        driven = json.loads((tmp_path / "driver.json").read_text())

    calls = [
        {**call, "producer": report["producer"]}
        for report in reports
        for call in report["calls"]
        if "error" not in call
    ]
    actions = driven["actions"]
    jobs = {job.pk: job for job in Job.objects.filter(task_name="rel.edge_both")}
    logs = list(CallLog.objects.filter(task="rel.edge_both"))
    tally = Counter((a["op"], a["reason"]) for a in actions)
    print(f"\n[window handles, both edge] {len(calls)} calls -> {len(jobs)} jobs; {dict(tally)}")
    assert [e for r in reports for e in r["other_errors"]] == [] and driven["errors"] == []
    assert sum(r["contention"] for r in reports) <= PRODUCERS * CALLS // 100
    assert tally[("flush", "flushed")] > 0 and tally[("cancel", "cancelled")] > 0

    # Every served call is counted once, on the job it returned; each job ran once or was
    # cancelled, never both.
    assert {job.status for job in jobs.values()} <= {Job.Status.SUCCESSFUL, Job.Status.CANCELLED}
    assert sum(job.enqueue_count for job in jobs.values()) == len(calls)
    ran = {pk for pk, job in jobs.items() if job.status == Job.Status.SUCCESSFUL}
    assert Counter(log.job_id for log in logs) == Counter(dict.fromkeys(ran, 1))
    # A burst is its leading job, due when it opened, then trailing jobs: a new one only
    # after the one before was claimed (a flushed trailing job that ran while the burst
    # stayed open), so every trailing job but the last ran, and a cancelled job is always
    # the last of its burst (a cancel closes it). The admin's edge column reads the same.
    bursts: dict[tuple, list[Job]] = defaultdict(list)
    for job in sorted(jobs.values(), key=lambda job: job.pk):
        bursts[(job.key_hash, job.opened_at, job.max_run_at)].append(job)
    for rows in bursts.values():
        shown = [(r.pk, r.status, r.run_at, r.opened_at) for r in rows]
        assert rows[0].run_at == rows[0].opened_at, shown
        assert all(r.status == Job.Status.SUCCESSFUL for r in rows[1:-1]), shown
        assert [edge_runs.run_edge(r) for r in rows] == ["leading"] + ["trailing"] * (
            len(rows) - 1
        ), shown
    assert any(len(rows) >= 2 for rows in bursts.values())
    done_cancels = [a for a in actions if a["op"] == "cancel" and a["done"]]
    assert {a["job_id"] for a in done_cancels} <= {
        pk for pk, job in jobs.items() if job.status == Job.Status.CANCELLED
    }
    # inspect(): the payload is the call that brought the job to the count it reported.
    by_count = {(c["job_id"], c["enqueue_count"]): c for c in calls}
    seen = [a for a in actions if a["op"] == "inspect"]
    assert len(seen) > 20
    for state in seen:
        call = by_count[(state["job_id"], state["calls"])]
        assert state["payload"] == {"producer": call["producer"], "seq": call["seq"]}, state
        assert state["in_order"] and state["key"] == f"edge:{call['key']}", state
        if state["open"]:
            assert state["status"] == "READY", state
    # Runs of one key never overlap (§4.5): the leading and the trailing run included.
    per_key: dict[str, list[CallLog]] = defaultdict(list)
    for log in logs:
        per_key[log.key].append(log)
    for key, runs in per_key.items():
        runs.sort(key=lambda log: log.started_at)
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert earlier.finished_at <= later.started_at, (key, earlier.job_id, later.job_id)
