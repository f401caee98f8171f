"""Every feature at once, with real processes, races and a SIGKILL (attack branch).

One task (``tests/testapp/tasks_every_feature.py``) has ``debounce_edge="both"`` with a
``debounce_merge``, ``rate_limit_per_key``, a ``concurrency`` cap, a ``timeout``,
``expires``, progress reports and a circuit breaker. Three producer processes hammer six
keys while two ``run_debounce_worker`` processes (three threads, prefetch on) run it and a
driver process inspects, flushes and cancels its windows, asks running jobs to stop and
cancels jobs. One worker is SIGKILLed mid-run and a replacement started. Then, from the
database: no two runs of a key at once; each run's payload is its row's; no merged call
lost; each key's starts within its bucket; no expired job ran; the progress on each row
is its latest run's; every job ended in a state the contract allows.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_debounce import codec
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.otel_export import read_spans
from tests.processes.traced_checks import span_problems
from tests.procs import app_name, freeze_outside_transaction, processes, wait_for
from tests.soak_checks import worst_rate_interval
from tests.testapp import tasks_every_feature
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KEYS = 6
#: A schedule in settings that every worker defers, each second, into key k0's bursts.
SCHEDULES = {
    "atk-each-second": {
        "task": tasks_every_feature.NAME,
        "cron": "* * * * * *",
        "args": ["k0"],
        "kwargs": {"producer": 99, "seq": 1},
        "overlap": True,
    }
}
Status = Job.Status


@pytest.fixture
def attack_task():
    yield tasks_every_feature.register()
    tasks_every_feature.unregister()


def _run_everything(tmp_path, mode: str = "kill", traced: bool = False) -> dict[str, Any]:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    env = child_env(
        **({"DEBOUNCE_TEST_OTEL_SPANS": str(spans_dir)} if traced else {}),
        DEBOUNCE_ATTACK_TASKS="1",
        DEBOUNCE_TEST_LEASE="2s",
        DEBOUNCE_TEST_PREFETCH="4",
        DEBOUNCE_TEST_SCHEDULES=json.dumps(SCHEDULES),
    )
    with processes(tmp_path, env) as procs:
        options = ("--concurrency", "3", "--poll-interval", "0.05")
        pg_name = app_name("atk") if connection.vendor == "postgresql" else None
        workers = [
            procs.worker(
                *options,
                name=f"worker-{i}",
                env={"DEBOUNCE_TEST_APP_NAME": pg_name} if i == 0 and pg_name else None,
            )
            for i in range(2)
        ]
        wait_for(
            lambda: all("starting" in w.stderr() for w in workers),
            timeout=60,
            what=lambda: f"both workers to start\n{procs.tails()}",
        )
        files = {n: tmp_path / f"driver-{n}" for n in ("ready", "go", "stop", "out")}
        driver = procs.start(
            "driver",
            [
                "-m",
                "tests.processes.every_feature_driver",
                f"--keys={KEYS}",
                "--seed=7",
                *(f"--{n}={path}" for n, path in files.items()),
            ],
        )
        wait_for(files["ready"].exists, timeout=60, what=lambda: f"the driver\n{driver.tail()}")
        files["go"].touch()
        producers = procs.producers(
            3, task=tasks_every_feature.NAME, keys=KEYS, calls=250, pause_every=5, pause=0.04
        )
        wait_for(
            lambda: CallLog.objects.filter(
                task=tasks_every_feature.NAME, finished_at=None
            ).exists(),
            timeout=30,
            what=lambda: f"a run in flight\n{procs.tails()}",
        )
        time.sleep(1.0)
        wait_for(
            lambda: CallLog.objects.filter(
                task=tasks_every_feature.NAME, finished_at=None, pid=workers[0].pid
            ).exists(),
            timeout=30,
            interval=0.01,
            what=lambda: f"worker-0 mid-run\n{procs.tails()}",
        )
        thawed_at = 0.0
        if mode == "kill":
            os.kill(workers[0].pid, signal.SIGKILL)
            killed_at = time.time()
            assert workers[0].wait(10) == -signal.SIGKILL
            time.sleep(0.5)
            workers.append(procs.worker(*options, name="worker-2"))
        else:  # freeze it past its lease (2 s): its runs are reclaimed, then it wakes up
            freeze_outside_transaction(workers[0], pg_app_name=pg_name)
            killed_at = time.time()
            time.sleep(5)
            thawed_at = time.time()
            workers[0].send(signal.SIGCONT)
            workers.append(procs.worker(*options, name="worker-2"))
        wait_for(lambda: "starting" in workers[-1].stderr(), timeout=60, what=workers[-1].tail)
        reports = procs.producer_results(producers, timeout=120)
        time.sleep(1.0)
        files["stop"].touch()
        assert driver.wait(60) == 0, driver.tail()
        checked = [timezone.now()]  # when the last check of "every job ended" began

        def every_job_ended() -> bool:
            checked[0] = timezone.now()
            return not Job.objects.filter(
                task_name=tasks_every_feature.NAME, status__in=[Status.READY, Status.RUNNING]
            ).exists()

        wait_for(
            every_job_ended,
            timeout=90,
            what=lambda: (
                "every job to end: "
                + str(
                    list(
                        Job.objects.filter(
                            task_name=tasks_every_feature.NAME,
                            status__in=[Status.READY, Status.RUNNING],
                        ).values_list("pk", "status", "run_at", "lease_expires_at")
                    )
                )
                + f"\n{procs.tails()}"
            ),
        )
        # The settings schedule ticks every second until the workers stop: a tick's job
        # created from here on may be left READY by the shutdown (checked in 7).
        drained_at = checked[0]
        alive = workers[1:] if mode == "kill" else workers
        for worker in alive:
            worker.send(signal.SIGTERM)
        for worker in alive:
            assert worker.wait(60) == 0, worker.tail()
        stderr = "".join(w.stderr() for w in workers)
    return {
        "reports": reports,
        "driver": json.loads(files["out"].read_text()),
        "killed_at": killed_at,
        "killed_pid": workers[0].pid,
        "thawed_at": thawed_at,
        "stderr": stderr,
        "drained_at": drained_at,
    }


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@pytest.mark.parametrize("mode", ["kill", "freeze", "traced"])
def test_everything_at_once_keeps_the_contract(tmp_path, attack_task, mode):
    """``traced``: ``kill`` with every process tracing (OpenTelemetry, decisions 211-213)."""
    traced = mode == "traced"
    run = _run_everything(tmp_path, "kill" if traced else mode, traced)
    problems: list[str] = []
    errors = [e for r in run["reports"] for e in r["other_errors"]]
    if errors:
        problems.append(f"producer errors: {errors[:5]}")
    if run["driver"]["errors"]:
        problems.append(f"driver errors: {run['driver']['errors'][:5]}")
    for marker in (
        "worker thread failed",
        "IntegrityError",
        "DataError",
        "ProgrammingError",
        "late_result",
        "Fatal",
    ):
        if marker in run["stderr"]:
            at = run["stderr"].index(marker)
            problems.append(
                f"a worker logged {marker!r}: {run['stderr'][max(0, at - 300) : at + 2500]}"
            )

    # A progress write that fails is logged and the run goes on (decision 203): counted only.
    # (Seen once in ~15 MariaDB runs; the error was not captured.)
    progress_errors = run["stderr"].count("could not write the progress")
    if progress_errors:
        at = run["stderr"].index("could not write the progress")
        print("\n[attack] first progress write error:", run["stderr"][at : at + 3000])
    jobs = {j.pk: j for j in Job.objects.filter(task_name=tasks_every_feature.NAME)}
    runs = list(CallLog.objects.filter(task=tasks_every_feature.NAME).order_by("started_at"))
    killed_at = datetime.fromtimestamp(run["killed_at"]).astimezone()

    # 1. Never two runs of one key at once (a killed run counts until the kill, at least).
    by_key: dict[str, list[CallLog]] = defaultdict(list)
    for r in runs:
        by_key[r.key].append(r)
    # A run of the frozen worker in flight while it was stopped may overlap its reclaimed
    # job's next run (a stalled worker, §11): its started_at may even be read before the
    # freeze and its row written after it (a SQLite write waiting for the lock).
    frozen_at = killed_at
    thawed = datetime.fromtimestamp(run["thawed_at"]).astimezone()
    stale = {
        r.pk
        for r in runs
        if mode == "freeze"
        and r.pid == run["killed_pid"]
        and r.started_at < thawed
        and (r.finished_at is None or r.finished_at > frozen_at)
    }
    for key, key_runs in by_key.items():
        for a, b in zip(key_runs, key_runs[1:], strict=False):
            end = a.finished_at or killed_at
            if a.pk in stale or b.pk in stale:
                continue  # a stalled worker's run may overlap its reclaimed job's (§11)
            if b.started_at < end:
                said = [
                    line
                    for line in run["stderr"].splitlines()
                    if f"job {a.job_id} " in line or f"job {b.job_id} " in line
                ]
                problems.append(
                    f"key {key}: run of job {b.job_id} (pid {b.pid}) started at {b.started_at} "
                    f"while job {a.job_id}'s run (pid {a.pid}, attempt {a.payload['attempt']}) "
                    f"went on until {end}; the workers said: {said}"
                )

    # 2. Each run's payload is the row's (a claimed job is never changed); 3. no merged call lost.
    for r in runs:
        job = jobs[r.job_id]
        args, kwargs = codec.decode_call(job.args, job.kwargs)
        if [list(args), kwargs] != [r.payload["args"], r.payload["kwargs"]]:
            problems.append(
                f"job {job.pk} ran {r.payload['args']} {r.payload['kwargs']} "
                f"but its row holds {args} {kwargs}"
            )
    for job in jobs.values():
        _, kwargs = codec.decode_call(job.args, job.kwargs)
        if "seqs" in kwargs and len(kwargs["seqs"]) != job.enqueue_count:
            problems.append(
                f"job {job.pk}: {job.enqueue_count} calls joined but its merged payload holds "
                f"{len(kwargs['seqs'])}"
            )
    for report in run["reports"]:
        for call in report["calls"]:
            job = jobs.get(call.get("job_id"))
            if job is None:
                continue
            _, kwargs = codec.decode_call(job.args, job.kwargs)
            if "seqs" in kwargs and [report["producer"], call["seq"]] not in kwargs["seqs"]:
                problems.append(
                    f"call {report['producer']}/{call['seq']} ({call['outcome']}) joined job "
                    f"{job.pk}, whose merged payload lacks it"
                )

    # 4. Each key's starts (the claim's instant, the bucket's clock) within its bucket.
    bucket = bucket_for(tasks_every_feature.RATE)
    for key, key_runs in by_key.items():
        starts = sorted(_ts(r.payload["claim_started_at"]) for r in key_runs)
        worst = worst_rate_interval(starts, bucket.capacity, bucket.per_second)
        if worst is not None and worst.excess > 1e-9:
            problems.append(f"key {key}: rate per key exceeded: {worst}")

    # 5. No run started past its job's expiry (a retry reached after it ends EXPIRED,
    # decision 49, so an EXPIRED job may have run an earlier attempt before its expiry).
    ran = {r.job_id for r in runs}
    for r in runs:
        expires = _ts(r.payload["expires_at"])
        # The hand-over judges expiry when a thread takes the job; the task's first line
        # (this row's started_at) comes a moment later: allow that moment, not more.
        if expires is not None and r.started_at > expires + timedelta(milliseconds=250):
            problems.append(f"job {r.job_id} started at {r.started_at}, past its expiry {expires}")

    # 6. The progress on each row is its latest run's.
    latest: dict[int, CallLog] = {}
    for r in runs:
        latest[r.job_id] = r
    for job in jobs.values():
        if job.progress_note and job.pk in latest:
            want = f"attempt {latest[job.pk].payload['attempt']} pid {latest[job.pk].pid}"
            if job.progress_note != want:
                problems.append(
                    f"job {job.pk}: progress {job.progress_note!r} is not its latest run's ({want})"
                )

    # 6a. A window the driver cancelled never ran; a job it cancelled READY never ran after.
    runs_of: dict[int, list[CallLog]] = defaultdict(list)
    for r in runs:
        runs_of[r.job_id].append(r)
    for action in run["driver"]["actions"]:
        if action["op"] == "cancel" and action.get("reason") == "cancelled":
            if runs_of.get(action["job_id"]) or jobs[action["job_id"]].status != Status.CANCELLED:
                problems.append(
                    f"window of job {action['job_id']} was cancelled, yet it ended "
                    f"{jobs[action['job_id']].status} after {len(runs_of[action['job_id']])} run(s)"
                )
        if action["op"] == "job_cancel":
            for pk in action["cancelled"]:
                at = datetime.fromtimestamp(action["at"]).astimezone()
                late = [r for r in runs_of.get(pk, []) if r.started_at > at]
                if late or jobs[pk].status != Status.CANCELLED:
                    problems.append(f"job {pk} was cancelled READY, then ran {len(late)} time(s)")

    # 6b. One job per tick, every tick's job a job of the task (decision 209).
    from django_debounce.periodic_ticks import PeriodicTick

    ticks = list(PeriodicTick.objects.filter(schedule="atk-each-second"))
    if not ticks:
        problems.append("no tick of the settings schedule was deferred")
    for tick in ticks:
        if tick.job_id is not None and tick.job_id not in jobs:
            problems.append(f"tick {tick.tick} names job {tick.job_id}, not a job of the task")
    tick_runs = [r for r in runs if r.payload["kwargs"].get("producer") == 99]
    if len(tick_runs) > len(ticks):
        problems.append(f"{len(tick_runs)} runs of tick calls for {len(ticks)} ticks")

    # 7. Every job ended in a state the contract allows.
    letters = set(DeadLetter.objects.values_list("job_id", flat=True))
    counts: dict[str, int] = defaultdict(int)
    late_ticks = {
        t.job_id for t in ticks if t.job_id is not None and t.deferred_at >= run["drained_at"]
    }
    for job in jobs.values():
        counts[job.status] += 1
        if job.status == Status.READY and job.pk in late_ticks:
            continue  # ticked while the workers were stopping: nobody was left to run it
        if job.status not in (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED, Status.EXPIRED):
            problems.append(f"job {job.pk} ended {job.status}")
        if (job.status == Status.FAILED) != (job.pk in letters):
            problems.append(f"job {job.pk} ended {job.status}, dead letter: {job.pk in letters}")
        if job.status == Status.SUCCESSFUL and job.pk not in ran:
            problems.append(f"job {job.pk} is SUCCESSFUL but never ran")
    print(
        f"\n[attack] {len(jobs)} jobs {dict(counts)}, {len(runs)} runs, "
        f"{len(run['driver']['actions'])} driver actions, "
        f"{len(run['driver']['contention'])} Job.cancel() deadlocks (known), "
        f"{len(ticks)} ticks {sorted({t.outcome for t in ticks})}, "
        f"{progress_errors} progress write(s) failed"
    )
    if traced:
        problems += span_problems(read_spans(tmp_path / "spans"), jobs, run["stderr"])
    assert problems == [], "\n".join(problems[:40])


def test_a_task_that_returned_is_recorded_once_whatever_note_it_reported(tmp_path):
    from django_debounce import enqueue

    with processes(
        tmp_path, child_env(DEBOUNCE_ATTACK_TASKS="1", DEBOUNCE_TEST_LEASE="2s")
    ) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        wait_for(lambda: "starting" in worker.stderr(), timeout=60, what=worker.tail)
        job = enqueue("atk.note")
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status not in (Status.READY, Status.RUNNING),
            timeout=30,
            what=lambda: f"job {job.pk} to end\n{worker.tail()}",
        )
        worker.send(signal.SIGTERM)
        worker.wait(60)
    row = Job.objects.get(pk=job.pk)
    runs = CallLog.objects.filter(task="atk.note").count()
    assert (row.status, runs) == (Status.SUCCESSFUL, 1), (row.status, runs, row.error)
