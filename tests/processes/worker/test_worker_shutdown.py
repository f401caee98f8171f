"""Stopping a worker subprocess with signals (§7): nothing is lost, nothing runs twice at once.

* SIGTERM or SIGINT: stop claiming, let running jobs finish (grace period), exit 0.
* A second SIGTERM/SIGINT: exit at once with status 1; the running job stays
  RUNNING until its lease lapses, then another worker runs it again.
* Grace period over: exit 0 with the job still RUNNING; it is reclaimed
  after its lease.
* SIGKILL: the job runs again once its lease has lapsed.
* SIGTERM while the claim statement runs (PostgreSQL, the claim held behind an
  outside ``LOCK TABLE``): the jobs that claim returns never start; they go back
  to READY at once as they were before the claim, and the worker exits 0.
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import timedelta

import psycopg
import pytest
import time_machine
from django.utils import timezone

from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env, run_burst
from tests.processes.signal_phases import claim_waits_on_lock, pg_dsn
from tests.procs import Proc, WorkerThread, app_name, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import work

pytestmark = pytest.mark.django_db(transaction=True)


def _started(job: Job, worker: Proc):
    """The job's run has begun; fail at once, with the worker's log, if the worker died."""

    def check() -> bool:
        if CallLog.objects.filter(job_id=job.pk).exists():
            return True
        assert worker.alive(), f"the worker exited {worker.popen.poll()}\n{worker.tail()}"
        return False

    return check


def _lease_lapsed(job: Job):
    return lambda: timezone.now() > Job.objects.get(pk=job.pk).lease_expires_at


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_running_jobs_finish_and_claims_nothing_new(tmp_path, signum):
    # 4 s: the signal must land while both still run (a free thread would claim `queued`).
    slow = [work.delay(f"slow-{i}", seconds=4) for i in range(2)]
    queued = work.delay("queued")
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        for job in slow:
            wait_for(_started(job, worker), timeout=30, what=f"job {job.pk} to start")
        worker.send(signum)
        late = work.delay("after-signal")  # due now; a stopping worker must not take it
        assert worker.wait(30) == 0, worker.tail()
        assert "claiming no more" in worker.stderr()

    for job in slow:
        job.refresh_from_db()
        assert job.status == Job.Status.SUCCESSFUL, job
        assert job.attempts == 1
        log = CallLog.objects.get(job_id=job.pk)
        assert log.finished_at is not None and log.pid == worker.pid
    for job in (queued, late):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.worker_id) == (Job.Status.READY, 0, "")
        assert job.lease_expires_at is None
    assert not Job.objects.filter(status=Job.Status.RUNNING).exists()
    assert CallLog.objects.count() == 2


def test_signal_while_idle_exits_at_once(tmp_path):
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(lambda: "starting" in worker.stderr(), timeout=30, what="the worker to start")
        time.sleep(0.3)
        sent = time.monotonic()
        worker.send(signal.SIGTERM)
        assert worker.wait(20) == 0, worker.tail()
        # At once: no grace period (30 s by default) is waited; the slack is for a loaded box.
        assert time.monotonic() - sent < 10


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_second_signal_exits_at_once_and_the_job_is_reclaimed(tmp_path, monkeypatch, signum):
    job = work.delay("stuck", seconds=60)
    with processes(tmp_path, child_env(DEBOUNCE_TEST_LEASE="2s")) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(_started(job, worker), timeout=30, what="the job to start")
        worker.send(signum)
        wait_for(lambda: "claiming no more" in worker.stderr(), timeout=20, what="first signal")
        sent = time.monotonic()
        worker.send(signum)
        assert worker.wait(20) == 1, worker.tail()  # non-zero: it abandoned a running job
        # At once: neither the 60 s job nor the 30 s default grace is waited for.
        assert time.monotonic() - sent < 10
        assert "second signal" in worker.stderr()

    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING and job.attempts == 1
    assert CallLog.objects.get(job_id=job.pk).finished_at is None
    monkeypatch.setenv("REL_SLEEP_SCALE", "0")
    # The lease (2 s) is still live: nobody may take the job yet. Poll at its last live
    # instant on the package's clock, not "now": the real 2 s may be gone on a loaded machine.
    with time_machine.travel(job.lease_expires_at - timedelta(milliseconds=1), tick=False):
        run_burst()
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    wait_for(_lease_lapsed(job), timeout=10, what="the lease to lapse")
    run_burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 2)
    assert job.result == {"pid": os.getpid(), "tag": "stuck"}
    assert DeadLetter.objects.count() == 0


def test_grace_period_over_leaves_the_job_for_a_reclaim(tmp_path, monkeypatch):
    job = work.delay("too-slow", seconds=60)
    env = child_env(DEBOUNCE_TEST_LEASE="2s", DEBOUNCE_TEST_SHUTDOWN_GRACE="1s")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(_started(job, worker), timeout=30, what="the job to start")
        sent = time.monotonic()
        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
        took = time.monotonic() - sent
        assert 0.9 <= took < 15, took  # waited the 1 s grace, not the 60 s job
        assert "grace period over" in worker.stderr()

    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    wait_for(_lease_lapsed(job), timeout=10, what="the lease to lapse")
    monkeypatch.setenv("REL_SLEEP_SCALE", "0")
    run_burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 2)
    assert [log.finished_at is None for log in CallLog.objects.order_by("id")] == [True, False]


def test_sigkill_mid_job_loses_nothing(tmp_path):
    job = work.delay("killed", seconds=60)
    env = child_env(DEBOUNCE_TEST_LEASE="2s")
    with processes(tmp_path, env) as procs:
        first = procs.worker("--poll-interval", "0.05", name="first")
        wait_for(_started(job, first), timeout=30, what="the job to start")
        behind = work.delay("behind")  # due, queued while the first worker is busy
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        job.refresh_from_db()
        assert job.status == Job.Status.RUNNING and job.attempts == 1
        assert Job.objects.get(pk=behind.pk).status == Job.Status.READY

        wait_for(_lease_lapsed(job), timeout=10, what="the lease to lapse")
        second = procs.worker("--burst", name="second", env={"REL_SLEEP_SCALE": "0"})
        assert second.wait(60) == 0, second.tail()

    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 2)
    assert job.result == {"pid": second.pid, "tag": "killed"}
    assert Job.objects.get(pk=behind.pk).status == Job.Status.SUCCESSFUL
    runs = list(CallLog.objects.filter(job_id=job.pk).order_by("id"))
    assert [(log.pid, log.finished_at is None) for log in runs] == [
        (first.pid, True),
        (second.pid, False),
    ]
    assert not Job.objects.filter(status__in=[Job.Status.READY, Job.Status.RUNNING]).exists()


# -- a stop that arrives while the claim statement runs (issue #8, item 2) -------------------


def _due_jobs() -> tuple[Job, Job]:
    """A job waiting for its second attempt (started once before) and a fresh one, both due."""
    retried = work.delay("retried")
    earlier = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk=retried.pk).update(
        attempts=1, started_at=earlier, error="builtins.ValueError: first run"
    )
    fresh = work.delay("fresh")
    return Job.objects.get(pk=retried.pk), Job.objects.get(pk=fresh.pk)


def _as_before_the_claim(job: Job) -> None:
    now = Job.objects.get(pk=job.pk)
    fields = ("status", "attempts", "worker_id", "lease_expires_at", "started_at", "run_at")
    assert {f: getattr(now, f) for f in fields} == {f: getattr(job, f) for f in fields}
    assert now.window_key is None


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("options", "claimed"),
    [(("--concurrency", "2"), 2), (("--burst",), 1)],
    ids=["threaded", "inline-burst"],
)
def test_sigterm_during_the_claim_puts_the_claimed_jobs_back_unstarted(tmp_path, options, claimed):
    jobs = _due_jobs()
    name = app_name("claim-term")
    with psycopg.connect(pg_dsn()) as holder:
        # EXCLUSIVE lets the worker's plain reads (its peek) through but holds its claim's
        # SELECT … FOR UPDATE until the test rolls back.
        holder.execute("LOCK TABLE django_debounce_job IN EXCLUSIVE MODE")
        with processes(tmp_path, child_env(DEBOUNCE_TEST_APP_NAME=name)) as procs:
            worker = procs.worker(*options, "--poll-interval", "0.05")

            def waiting() -> bool:
                assert worker.alive(), f"the worker exited early\n{worker.tail()}"
                return claim_waits_on_lock(name)

            wait_for(waiting, timeout=60, what=lambda: f"the claim to wait\n{worker.tail()}")
            worker.send(signal.SIGTERM)
            wait_for(
                lambda: "claiming no more" in worker.stderr(),
                timeout=30,
                what=lambda: f"the worker to take the signal\n{worker.tail()}",
            )
            holder.rollback()  # the claim statement now returns its jobs
            assert worker.wait(30) == 0, worker.tail()
    log = worker.stderr()
    assert f"put back {claimed} claimed job(s)" in log, log
    assert not re.search(r"running job \d", log), log  # no start, so no job_started either
    assert "stopped after 0 job(s)" in log, log
    for job in jobs:
        _as_before_the_claim(job)
    assert not CallLog.objects.exists()
    assert not DeadLetter.objects.exists()


@pytest.mark.postgres
def test_a_stop_during_the_claim_starts_nothing_and_sends_no_signal(signal_log):
    """The in-process form: ``Worker.stop()`` (what the signal handler calls) lands while the
    threaded loop's claim waits; no ``job_started`` is sent and the jobs are as before."""
    jobs = _due_jobs()
    signal_log.clear()
    with psycopg.connect(pg_dsn()) as holder:
        holder.execute("LOCK TABLE django_debounce_job IN EXCLUSIVE MODE")
        runner = WorkerThread("stopped-in-claim", concurrency=2).start()
        wait_for(claim_waits_on_lock, timeout=60, what="the claim to wait")
        runner.worker.stop()
        holder.rollback()
        runner.stop()
    assert runner.worker.processed == 0
    assert [entry[0] for entry in signal_log] == []
    for job in jobs:
        _as_before_the_claim(job)
    assert not CallLog.objects.exists()


def test_a_claimed_job_a_job_thread_takes_after_the_stop_is_put_back():
    """The last hand-over: a job claimed before the stop but taken by a job thread after it
    (the loop queued it just as the signal came) never starts either."""
    from django_debounce.worker.loop import Worker

    jobs = _due_jobs()
    worker = Worker(concurrency=2, handle_signals=False, worker_id="handover")
    claimed = worker._claim(2)
    assert [job.pk for job in claimed] == [job.pk for job in jobs]
    worker.stop()
    for job in claimed:
        worker._in_flight[job.pk] = job
        worker._work.put(job)
    worker._work.put(None)
    worker._thread_main()  # what a job thread runs
    assert worker.processed == 0 and not worker._in_flight
    for job in jobs:
        _as_before_the_claim(job)
    assert not CallLog.objects.exists()


@pytest.mark.postgres
def test_a_second_signal_inside_the_loop_exits_without_waiting_for_running_jobs(tmp_path):
    """The second signal means "exit now" wherever in the loop it lands (a CI flake on MariaDB).

    It lands here while the loop's claim waits behind an outside lock and a 60 s job runs
    on the other thread. Before the fix its ``SystemExit`` passed through the loop's
    ``finally`` into the shutdown drain, which waited the whole grace period (30 s) for the
    running job before the process could exit.
    """
    running = work.delay("long", seconds=60)
    name = app_name("claim-abort")
    # Polling, not LISTEN/NOTIFY: a wake-up lets the free thread claim (and run) "queued"
    # before the test takes the table lock, and this test is about a claim blocked by it.
    env = child_env(DEBOUNCE_TEST_APP_NAME=name, DEBOUNCE_TEST_WAKEUP="poll")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        wait_for(_started(running, worker), timeout=30, what="the long job to start")
        queued = work.delay("queued")
        with psycopg.connect(pg_dsn()) as holder:
            holder.execute("LOCK TABLE django_debounce_job IN EXCLUSIVE MODE")
            wait_for(
                lambda: claim_waits_on_lock(name),
                timeout=60,
                what=lambda: f"the claim to wait\n{worker.tail()}",
            )
            worker.send(signal.SIGTERM)
            wait_for(
                lambda: "claiming no more" in worker.stderr(),
                timeout=30,
                what=lambda: f"the first signal\n{worker.tail()}",
            )
            sent = time.monotonic()
            worker.send(signal.SIGINT)
            wait_for(
                lambda: "second signal" in worker.stderr(),
                timeout=30,
                what=lambda: f"the second signal\n{worker.tail()}",
            )
            holder.rollback()
        assert worker.wait(20) == 1, worker.tail()  # non-zero: it abandoned a running job
        # At once: neither the 60 s job nor the 30 s default grace is waited for.
        assert time.monotonic() - sent < 15
        assert "second signal with 1 job(s) still running" in worker.stderr(), worker.tail()
    running.refresh_from_db()
    assert (running.status, running.attempts) == (Job.Status.RUNNING, 1)
    assert CallLog.objects.get(job_id=running.pk).finished_at is None
    assert not CallLog.objects.filter(job_id=queued.pk).exists()
