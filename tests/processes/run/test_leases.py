"""Leases (§7, §11): renewed while a job runs, reclaimed when the worker dies, fenced.

Worker threads (``Worker(handle_signals=False)``) and worker subprocesses run
real jobs; a worker "dies" by SIGKILL, and a "fault that stops renewal" is a
SIGSTOP of the worker process.

Decisions asserted here (documented in the project's docs):

* A reclaim spends one of ``max_retries``: ``attempts`` counts runs started,
  a run whose worker died included. A job that kills its worker on every run
  ends FAILED after ``max_retries + 1`` runs, with a ``failed:`` dead letter.
* A worker whose lease lapsed and whose job was reclaimed has its late result
  discarded (the (worker id, attempt) pair is a fencing token) and logs it;
  the job keeps the result of the run that finished under a live lease.
* A lease expiring at ``E`` is expired at ``E``: the first poll at or after
  ``E`` reclaims the job.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from django_debounce.models import DeadLetter, Job
from tests.conftest import T, child_env, is_postgres, run_burst
from tests.procs import WorkerThread, app_name, freeze_outside_transaction, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import deadline, email_report, kill_own_worker, report, work

pytestmark = pytest.mark.django_db(transaction=True)

#: Renewed every 0.5 s, it lapses only if a renewal comes 1 s late (with 1 s, 0.5 s late was
#: enough: a stall a loaded machine can cause, and the rival worker then reran the job).
LEASE = timedelta(seconds=1.5)


def _watch_lease(job_id: int, until_status: str, timeout: float) -> list:
    """Sample the job's lease every 100 ms until it reaches ``until_status``.

    Returns (sampled_at, lease_expires_at) pairs taken while it was RUNNING.
    """
    samples = []
    deadline_at = time.monotonic() + timeout
    while True:
        job = Job.objects.get(pk=job_id)
        if job.status == until_status:
            return samples
        if job.status == Job.Status.RUNNING:
            samples.append((timezone.now(), job.lease_expires_at))
        assert time.monotonic() < deadline_at, f"job {job_id} still {job.status}"
        time.sleep(0.1)


def _run_longer_than_lease(task_call, tag: str):
    """W1 claims a 3 s job under a 1.5 s lease while W2 polls every 100 ms; return what we saw."""
    job = task_call()
    w1 = WorkerThread("W1", lease=LEASE).start()
    w2 = None
    try:
        wait_for(
            lambda: Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING).exists(),
            timeout=30,
            what="W1 to claim",
        )
        w2 = WorkerThread("W2", lease=LEASE).start()
        samples = _watch_lease(job.pk, Job.Status.SUCCESSFUL, timeout=20)
    finally:
        if w2 is not None:
            w2.stop()
        w1.stop()
    assert w2.worker.processed == 0
    assert w1.worker.processed == 1
    job.refresh_from_db()
    return job, samples


def _assert_lease_renewed(job: Job, samples) -> None:
    first_lease = job.started_at + LEASE
    leases = [lease for _, lease in samples]
    assert len(samples) >= 10  # ~3 s of samples every 100 ms (fewer on a loaded machine)
    assert leases == sorted(leases)  # never moves back
    assert leases[-1] - first_lease >= timedelta(seconds=1.5)  # moved forward during the run
    assert len(set(leases)) >= 4
    # It never lapsed: every sample saw a lease in the future.
    assert all(lease > sampled_at for sampled_at, lease in samples)


def test_b23_deadline_independent_of_lease():
    # A distant deadline is not a lease: the row stays READY and unleased until it is due.
    with time_machine.travel(T, tick=False) as traveller:
        job = deadline.delay("x")
        assert job.run_at == T + timedelta(hours=2)
        for turn, minutes in enumerate(range(0, 140, 10)):  # T .. T+2h10m
            traveller.move_to(T + timedelta(minutes=minutes))
            run_burst(worker_id=f"W{turn % 2 + 1}")
            job.refresh_from_db()
            if minutes < 120:
                assert job.status == Job.Status.READY
                assert job.lease_expires_at is None and job.worker_id == ""
                assert job.attempts == 0 and job.started_at is None
                assert CallLog.objects.count() == 0
            else:
                assert job.status == Job.Status.SUCCESSFUL
                assert job.attempts == 1  # exactly one claim
                assert CallLog.objects.filter(task="rel.deadline").count() == 1
        assert job.started_at == T + timedelta(hours=2)
        assert job.worker_id == "W1"  # turn 12 (T+2h) belonged to W1

    # In real time: a 3 s run under a 1.5 s lease is renewed and never claimed twice.
    CallLog.objects.all().delete()
    job, samples = _run_longer_than_lease(lambda: work.delay("b23", seconds=3), "b23")
    _assert_lease_renewed(job, samples)
    assert job.worker_id == "W1"
    assert job.attempts == 1
    assert CallLog.objects.filter(task="rel.work").count() == 1
    assert job.lease_expires_at is None  # released when it finished


def test_b24_long_task_single_execution(mailoutbox):
    job, samples = _run_longer_than_lease(lambda: email_report.delay(24, seconds=3), "b24")
    _assert_lease_renewed(job, samples)
    assert job.status == Job.Status.SUCCESSFUL
    assert job.worker_id == "W1"
    assert job.attempts == 1
    assert CallLog.objects.filter(task="rel.email_report").count() == 1
    assert len(mailoutbox) == 1
    assert mailoutbox[0].body == "report for 24"


def test_inline_burst_renews_each_long_job_from_one_keeper_thread():
    """An inline ``--burst`` (concurrency 1) keeps each running job's lease alive (§7).

    One lease keeper serves the whole run (it used to be a thread per job): it renews the
    job in flight every third of the lease, from that job's start.
    """
    jobs = [work.delay(f"inline-{i}", seconds=3) for i in range(2)]  # twice the lease
    w1 = WorkerThread("W1", lease=LEASE, burst=True, concurrency=1).start()
    samples: dict[int, list] = {job.pk: [] for job in jobs}
    keepers = set()
    try:
        while w1.alive():
            keepers.update(t for t in threading.enumerate() if t.name == "debounce-lease")
            for job in Job.objects.filter(pk__in=samples, status=Job.Status.RUNNING):
                samples[job.pk].append((timezone.now(), job.lease_expires_at))
            time.sleep(0.1)
    finally:
        w1.stop()
    assert w1.worker.processed == 2
    assert len(keepers) == 1 and not any(t.is_alive() for t in keepers)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.worker_id) == (Job.Status.SUCCESSFUL, 1, "W1")
        seen = samples[job.pk]
        leases = [lease for _, lease in seen]
        assert len(seen) >= 5  # ~3 s of samples every 100 ms (fewer on a loaded machine)
        assert leases == sorted(leases)
        assert leases[-1] - (job.started_at + LEASE) >= timedelta(seconds=0.5)  # renewed
        assert all(lease > sampled_at for sampled_at, lease in seen)  # never lapsed


def test_b27_dead_worker_job_recovered_after_lease(tmp_path, monkeypatch):
    # T0 is ten seconds ago, so J1's window (10 s) is due now for a worker in real time.
    t0 = timezone.now().replace(microsecond=0) - timedelta(seconds=10)
    with time_machine.travel(t0, tick=False):
        j1 = report.delay(1, seconds=120)
    assert j1.outcome == "created" and j1.run_at == t0 + timedelta(seconds=10)

    with processes(tmp_path, child_env()) as procs:
        w1 = procs.worker("--poll-interval", "0.1", name="w1")
        wait_for(
            lambda: CallLog.objects.filter(job_id=j1.pk).exists() or not w1.alive(),
            timeout=30,
            what="W1 to start J1",
        )
        assert w1.alive(), w1.tail()
        w1.send(signal.SIGKILL)
        assert w1.wait(10) == -signal.SIGKILL
    j1.refresh_from_db()
    assert j1.status == Job.Status.RUNNING and j1.attempts == 1
    assert j1.worker_id.split(":")[1] == str(w1.pid)
    e = j1.lease_expires_at
    assert e == j1.started_at + timedelta(seconds=60)

    # From here the test's clock drives every poll (the worker runs inline, in this process).
    monkeypatch.setenv("REL_SLEEP_SCALE", "0")
    t2 = max(t0 + timedelta(seconds=20), timezone.now())
    with time_machine.travel(t2, tick=False) as traveller:
        j2 = report.delay(1, seconds=120)
        assert j2.outcome == "created" and j2.pk != j1.pk  # the zombie does not absorb it
        assert (j2.opened_at, j2.run_at, j2.max_run_at) == (
            t2,
            t2 + timedelta(seconds=10),
            t2 + timedelta(seconds=60),
        )
        polls = [t2 + timedelta(seconds=s) for s in (10, 20, 30)] + [e - timedelta(milliseconds=1)]
        for at in (p for p in polls if p < e):
            traveller.move_to(at)
            run_burst()
            assert Job.objects.get(pk=j1.pk).status == Job.Status.RUNNING
            assert Job.objects.get(pk=j2.pk).attempts == 0  # held back by the run in flight
            assert CallLog.objects.count() == 1

        traveller.move_to(e)  # the first poll at E reclaims J1, reruns it, then runs J2
        run_burst()

    j1.refresh_from_db()
    j2.refresh_from_db()
    assert j1.status == j2.status == Job.Status.SUCCESSFUL
    assert j1.attempts == 2  # the dead run counted (decision: a reclaim spends a retry)
    assert j2.attempts == 1
    assert j1.args == [1] and j1.kwargs == {"seconds": 120}  # its own payload
    assert j1.result == {"pid": os.getpid()}
    runs = list(CallLog.objects.order_by("id").values_list("job_id", "pid", "finished_at"))
    assert [(job_id, pid) for job_id, pid, _ in runs] == [
        (j1.pk, w1.pid),
        (j1.pk, os.getpid()),
        (j2.pk, os.getpid()),
    ]
    assert runs[0][2] is None  # the killed run never finished
    assert j2.started_at >= j1.finished_at == e
    assert not Job.objects.filter(status=Job.Status.RUNNING).exists()
    assert DeadLetter.objects.count() == 0


def test_job_killing_its_workers_ends_failed_with_dead_letter(tmp_path):
    job = kill_own_worker.delay("boom")
    assert job.max_retries == 1  # two runs in all
    env = {"DEBOUNCE_TEST_LEASE": "1s", "REL_ALLOW_SUICIDE": "1"}
    with processes(tmp_path, child_env(**env)) as procs:
        for run in (1, 2):
            proc = procs.worker("--burst", name=f"burst-{run}")
            assert proc.wait(60) == -signal.SIGKILL, proc.tail()
            job.refresh_from_db()
            assert job.status == Job.Status.RUNNING and job.attempts == run
            assert CallLog.objects.count() == run
            wait_for(
                lambda: timezone.now() > Job.objects.get(pk=job.pk).lease_expires_at,
                timeout=5,
                what="the lease to lapse",
            )
    run_burst()  # the next poll finds attempts (2) > max_retries (1): no third run
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.attempts == 2
    assert job.lease_expires_at is None and job.finished_at is not None
    assert job.error.startswith("django_debounce.worker.loop.LeaseExpired: ")
    assert CallLog.objects.count() == 2
    letter = DeadLetter.objects.get()
    assert letter.job_id == job.pk
    assert letter.reason.startswith("failed: lease expired after 2 attempt(s)")
    assert (letter.task_name, letter.args) == ("rel.kill_own_worker", ["boom"])
    assert letter.metadata["attempts"] == 2


def test_b23_late_finish_after_lapsed_lease_is_discarded(tmp_path, monkeypatch):
    """A worker frozen past its lease (SIGSTOP) finishes late: its result is fenced off."""
    job = work.delay("late", seconds=4)  # W1 must still be in it when it is frozen
    pg_name = app_name("late") if is_postgres() else None
    env = {"DEBOUNCE_TEST_LEASE": "1s"}
    if pg_name:
        env["DEBOUNCE_TEST_APP_NAME"] = pg_name
    with processes(tmp_path, child_env(**env)) as procs:
        w1 = procs.worker("--poll-interval", "0.1", name="w1")
        wait_for(
            lambda: CallLog.objects.filter(job_id=job.pk).exists() or not w1.alive(),
            timeout=30,
            what="W1 to start the job",
        )
        assert w1.alive(), w1.tail()
        freeze_outside_transaction(w1, pg_app_name=pg_name)
        wait_for(
            lambda: timezone.now() > Job.objects.get(pk=job.pk).lease_expires_at,
            timeout=5,
            what="W1's lease to lapse",
        )
        monkeypatch.setenv("REL_SLEEP_SCALE", "0")
        run_burst(worker_id="W2")  # reclaims and reruns it here
        job.refresh_from_db()
        assert (job.status, job.worker_id, job.attempts) == (Job.Status.SUCCESSFUL, "W2", 2)
        second = (job.result, job.finished_at)
        assert job.result == {"pid": os.getpid(), "tag": "late"}

        w1.send(signal.SIGCONT)
        wait_for(
            lambda: "outcome is discarded" in w1.stderr(),
            timeout=15,
            what="W1 to log its discarded late result",
        )
        assert CallLog.objects.filter(job_id=job.pk, finished_at__isnull=True).count() == 0
        w1.send(signal.SIGTERM)
        assert w1.wait(15) == 0, w1.tail()

    job.refresh_from_db()
    assert (job.status, job.worker_id, job.attempts) == (Job.Status.SUCCESSFUL, "W2", 2)
    assert (job.result, job.finished_at) == second
    first_run, second_run = CallLog.objects.filter(job_id=job.pk).order_by("id")
    assert first_run.pid == w1.pid and second_run.pid == os.getpid()
    assert first_run.finished_at > second_run.finished_at  # the first run really finished late
    assert DeadLetter.objects.count() == 0
