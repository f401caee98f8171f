"""Stopping a worker subprocess with signals (§7): nothing is lost, nothing runs twice at once.

* SIGTERM or SIGINT: stop claiming, let running jobs finish (grace period), exit 0.
* A second SIGTERM/SIGINT: exit at once with status 1; the running job stays
  RUNNING until its lease lapses, then another worker runs it again.
* Grace period over: exit 0 with the job still RUNNING; it is reclaimed
  after its lease.
* SIGKILL: the job runs again once its lease has lapsed.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env, run_burst
from tests.procs import Proc, processes, wait_for
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
