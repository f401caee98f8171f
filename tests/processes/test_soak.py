"""The soak (issue #18 item 4): producers and workers for minutes, then the invariants on the rows.

Four producer processes (``tests/processes/soak_producer.py``) make a paced mix
of debounced, merged, bulk, rate-limited, capped, expiring, shed, failing and
breaker-gated calls for ``DEBOUNCE_SOAK_SECONDS`` (default 120 s on PostgreSQL,
40 s on MariaDB) while two ``run_debounce_worker`` processes with four threads
each (prefetch on, the default poll interval) run them. Every few seconds the
test checks that no (task, key) has two open windows. Then the producers stop,
the workers drain every job, and the rows are judged (``tests/soak_checks.py``):

* every call is accounted for: merged and bulk items each ran exactly once, in
  the run of the job their call returned; a debounced call's job ran once; an
  expired job never ran (some always expire: the expiring task runs one at a
  time, slower than its calls come); a shed or failed job has its dead letter; every job
  and dead letter is some call's; nothing is left READY or RUNNING;
* a job ran (CallLog rows) as many times as its attempts say;
* runs of one debounce key never overlapped, the caps (2 and 1) were never exceeded,
  and the starts of the rate-limited tasks keep their buckets' exact rule;
* each worker's resident set (``VmRSS``) after the drain is within 10 % of what
  it was 10 s into the run (a leak in a loop that runs per claim or per job
  would grow it by far more over thousands of jobs).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.procs import Proc, Processes, processes, wait_for
from tests.soak_checks import (
    Rows,
    account,
    keyed_overlaps,
    most_overlapping,
    open_windows_per_key,
    rss_kib,
    worst_rate_interval,
)
from tests.testapp import tasks_soak
from tests.testapp.models import CallLog

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = ("--concurrency", "4")
PRODUCERS = 4
#: Calls a second per producer, about (a bulk call is a batch of six).
PACE = 12.0
#: RSS is sampled this long into the run, and compared with the RSS after the drain.
WARM = 10.0


def soak_seconds(default: float) -> float:
    return float(os.environ.get("DEBOUNCE_SOAK_SECONDS", default))


def start_producers(procs: Processes, seconds: float) -> list[Proc]:
    go = procs.workdir / "go"
    started = [
        procs.start(
            f"producer-{i}",
            [
                "-m",
                "tests.processes.soak_producer",
                f"--producer={i}",
                f"--seconds={seconds}",
                f"--pace={PACE}",
                f"--ready={procs.workdir / f'ready-{i}'}",
                f"--go={go}",
                f"--out={procs.workdir / f'producer-{i}.json'}",
            ],
        )
        for i in range(PRODUCERS)
    ]
    wait_for(
        lambda: all((procs.workdir / f"ready-{i}").exists() for i in range(PRODUCERS)),
        timeout=60,
        what=lambda: f"producers to connect\n{procs.tails()}",
    )
    go.touch()
    return started


def read_rows() -> Rows:
    jobs = {
        pk: {
            "task": task,
            "status": status,
            "args": args,
            "count": count,
            "attempts": attempts,
            "started_at": started_at,
            "expires_at": expires_at,
        }
        for pk, task, status, args, count, attempts, started_at, expires_at in Job.objects.values_list(
            "pk",
            "task_name",
            "status",
            "args",
            "enqueue_count",
            "attempts",
            "started_at",
            "expires_at",
        )
    }
    runs = [
        {
            "task": log.task,
            "key": log.key,
            "ids": log.payload["ids"],
            "attempt": log.payload["attempt"],
            "job_id": log.job_id,
            "started": log.started_at,
            "finished": log.finished_at,
        }
        for log in CallLog.objects.all()
    ]
    letters: dict[int | None, list[str]] = {}
    for job_id, reason in DeadLetter.objects.values_list("job_id", "reason"):
        letters.setdefault(job_id, []).append(reason)
    return Rows(jobs=jobs, runs=runs, letters=letters)


def soak(tmp_path, seconds: float) -> None:
    env = child_env(DEBOUNCE_SOAK_TASKS="1")
    windows_seen = 0
    with processes(tmp_path, env) as procs:
        workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
        wait_for(
            lambda: all("starting" in w.stderr() for w in workers),
            timeout=60,
            what=lambda: f"both workers to start\n{procs.tails()}",
        )
        producers = start_producers(procs, seconds)
        began = time.monotonic()
        warm: list[int] = []
        trend: list[list[int]] = []  # every 10 s: each worker's RSS in KiB
        while any(p.alive() for p in producers):
            time.sleep(1.0)
            if time.monotonic() - began >= WARM * (len(trend) + 1):
                trend.append([rss_kib(w.pid) for w in workers])
                warm = warm or trend[0]
            doubled = open_windows_per_key()
            assert not doubled, f"two open windows for one key: {doubled}"
            windows_seen += 1
            assert all(w.alive() for w in workers), procs.tails()
            assert time.monotonic() - began < seconds + 120, procs.tails()
        produced_for = time.monotonic() - began
        for proc in producers:
            assert proc.wait(10) == 0, proc.tail()
        reports = [
            json.loads((tmp_path / f"producer-{i}.json").read_text()) for i in range(PRODUCERS)
        ]
        at_stop = [rss_kib(w.pid) for w in workers]
        drain_began = time.monotonic()
        wait_for(
            lambda: (
                not Job.objects.filter(status__in=[Job.Status.READY, Job.Status.RUNNING]).exists()
            ),
            timeout=120,
            interval=0.5,
            what=lambda: (
                f"the drain: {Counter(Job.objects.values_list('status', flat=True))}\n"
                f"{procs.tails()}"
            ),
        )
        drained_in = time.monotonic() - drain_began
        end = [rss_kib(w.pid) for w in workers]
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(60) == 0, worker.tail()
        stderr = "".join(w.stderr() for w in workers)
    # The only tracebacks are the failing task's own (logged with each failed run).
    foreign = [t for t in stderr.split("Traceback (most recent")[1:] if "SoakTaskError" not in t]
    assert not foreign, foreign[0][:3000]
    errors = [e for r in reports for e in r["errors"]]
    assert not errors, errors[:10]
    calls = [call for r in reports for call in r["calls"]]
    rows = read_rows()
    problems = account(calls, rows, tasks_soak.FAILING_RUNS)
    overlaps = keyed_overlaps(rows.runs)
    capped = [(r["started"], r["finished"]) for r in rows.runs if r["task"] == "soak.capped"]
    expiring = [(r["started"], r["finished"]) for r in rows.runs if r["task"] == "soak.expiring"]
    breaches = {}
    for name in ("soak.rated", "soak.dropped"):
        options = tasks_soak.DECLARATIONS[name][1]
        bucket = bucket_for(options["rate_limit"], options.get("rate_limit_burst"))
        starts = [
            job["started_at"]
            for job in rows.jobs.values()
            if job["task"] == name and job["status"] == "SUCCESSFUL"
        ]
        breaches[name] = worst_rate_interval(starts, bucket.capacity, bucket.per_second)
    kinds = Counter(call["kind"] for call in calls if "error" not in call)
    statuses = Counter(job["status"] for job in rows.jobs.values())
    print(
        f"\n[soak] {seconds:.0f} s asked, producers ran {produced_for:.1f} s, drained in "
        f"{drained_in:.1f} s; {len(calls)} calls ({sum(kinds.values())} made, "
        f"{sum(r['contention'] for r in reports)} EnqueueContentionError): {dict(kinds)}; "
        f"{len(rows.jobs)} jobs {dict(statuses)}; {len(rows.runs)} runs; "
        f"{sum(len(v) for v in rows.letters.values())} dead letters; most capped runs at "
        f"once {most_overlapping(capped)}; tightest rate intervals "
        f"{ {k: str(v) for k, v in breaches.items()} }; window checks {windows_seen}; "
        f"RSS KiB at {WARM:.0f} s {warm}, when the producers stopped {at_stop}, after the "
        f"drain {end}; RSS MiB every {WARM:.0f} s: "
        f"{[[round(kib / 1024, 1) for kib in sample] for sample in trend]}"
    )
    assert not problems, f"{len(problems)} problems, the first: {problems[:20]}"
    assert not overlaps, f"runs of one key overlapped: {overlaps[:10]}"
    assert most_overlapping(capped) <= 2
    assert most_overlapping(expiring) <= 1
    for name, breach in breaches.items():
        assert breach is None or breach.excess <= 1e-9, f"{name}: rate exceeded: {breach}"
    assert kinds["merged"] and kinds["bulk"] and statuses["EXPIRED"] and statuses["SHED"]
    assert statuses["FAILED"] and not statuses["CANCELLED"]
    assert warm, "the run ended before its RSS sample"
    for first, last in zip(warm, end, strict=True):
        assert last <= first * 1.10, f"worker RSS grew from {first} KiB to {last} KiB"


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(soak_seconds(120) + 300)
def test_soak_on_postgresql(tmp_path):
    soak(tmp_path, soak_seconds(120))


@pytest.mark.mariadb
@pytest.mark.timeout(soak_seconds(40) + 300)
def test_soak_on_mariadb(tmp_path):
    soak(tmp_path, soak_seconds(40))
