"""SIGTERM and SIGKILL at every phase of a real worker process (issue #18 item 2; §7, §11).

Each test starts ``run_debounce_worker`` as a subprocess, brings it to one phase of its
loop and holds it there on a condition the database or the process shows (never a sleep),
delivers the signal, and checks the exit status, every job's row and how many times each
job's body ran (a ``CallLog`` row per run, ``rel.work``/``rel.gate`` in tests/testapp).
A SIGKILLed worker's jobs are then reclaimed once their lease lapsed and run by a worker
in this process (``run_burst``), so "runs again exactly once more" is counted.

``rel.gate`` blocks until a barrier file exists: a run is "mid-job" until the test says.
The Celery dispatcher's phases are in ``test_signals_at_every_phase_dispatcher.py``.

=====================  =======  ==================================================  =============================================
phase                  signal   how the test reaches it                             what is asserted
=====================  =======  ==================================================  =============================================
idle                   TERM     the only due job ran and its success is written;    exit 0; the done job ran once and stays
                       KILL     another job is due in an hour                       SUCCESSFUL; the later one READY, attempts 0
                                                                                    (-9 for KILL, then nothing left RUNNING)
inside the claim       TERM     outside ``LOCK TABLE … EXCLUSIVE`` holds the claim  test_worker_shutdown.py::
                                statement; ``pg_stat_activity`` shows it waiting    test_sigterm_during_the_claim_puts_the_
                                (PostgreSQL)                                        claimed_jobs_back_unstarted: exit 0, both
                                                                                    jobs as before the claim, nothing ran
                       KILL     the same                                            -9; the claim commits server-side after the
                                                                                    lock (its client is gone): both RUNNING, an
                                                                                    attempt spent; after the lease each runs
                                                                                    exactly once (it never ran before)
between claim and      TERM     concurrency 1, prefetch: a gate job runs and three  exit 0; the three are READY at once, attempts
start                           jobs claimed ahead wait RUNNING behind it           and started_at as before, while the gate job
                                                                                    still runs; it then ends once; none of the
                                                                                    three ran
                       KILL     the same                                            -9; all four RUNNING, attempts 1; after the
                                                                                    lease the gate job runs once more, the three
                                                                                    once (their first run), attempts 2
mid-job                TERM     a gate job runs, another job is due behind it       exit 0 once the gate opens; the job ran once,
                                                                                    SUCCESSFUL; the one behind READY, attempts 0
                       KILL     test_worker_shutdown.py::test_sigkill_mid_job_loses_nothing (60 s job; -9; reruns once after
                                its lease)
between run and the    TERM     flush interval 60 s, prefetch 0: two jobs returned  exit 0; the two are written at the signal,
batched success                 (their successes wait for the write) and a gate     before the gate job ends; each ran once
write                           job runs; one written success from before
                       KILL     the same                                            -9; the two (and the gate job) RUNNING; after
                                                                                    the lease each runs exactly once more; the
                                                                                    written success never reruns
during the flush       TERM     as above, an outside row lock on one pending job;   exit 0; both written once the lock goes, each
                                the gate opens, the short claim flushes, the        ran once
                                write waits (seen with its SQL text)
                       KILL     the same                                            -9; the write commits server-side once the
                                                                                    lock goes (its client is gone): both
                                                                                    SUCCESSFUL, and nothing reruns after the lease
during lease renewal   TERM     a gate job runs, an outside row lock on it: the     exit 0 once the lock goes and the gate opens;
                                renewal ``UPDATE`` waits (seen with its SQL text)   the job ran once, SUCCESSFUL
                       KILL     the same                                            -9; RUNNING; after the lease it runs exactly
                                                                                    once more
=====================  =======  ==================================================  =============================================

PostgreSQL only: inside the claim (``LOCK TABLE``). PostgreSQL and MariaDB: the flush and
the renewal (row locks held from outside). Everywhere: the rest, whose SIGKILL half is
marked ``slow`` (run once in CI, on PostgreSQL). The Guarantees page
(docs/explanation/guarantees.md) names these tests.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from django_debounce.models import Job
from tests.conftest import child_env, is_postgres, run_burst
from tests.processes.signal_phases import (
    FLUSH,
    RENEWAL,
    RowLock,
    alive_or_fail,
    claim_fields,
    claim_waits_on_lock,
    exit_status,
    lease_lapsed,
    other_sessions,
    row,
    runs,
    statement_waits,
    table_locked,
    touch,
)
from tests.procs import Proc, app_name, pg_backends, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_common import noop
from tests.testapp.tasks_reliability import gate, work

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"]
)
#: The same, the SIGKILL half run once in CI (slow): its phase does not depend on the database,
#: and its rerun after the lease is the longest part.
SIGNALS_KILL_ONCE = pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGKILL"],
)
Status = Job.Status


def _stop(worker: Proc, signum: int) -> None:
    """Deliver ``signum``; for SIGTERM, wait until the worker took it."""
    worker.send(signum)
    if signum == signal.SIGTERM:
        wait_for(
            lambda: "claiming no more" in worker.stderr(),
            timeout=30,
            what=lambda: f"the worker to take the signal\n{worker.tail()}",
        )


def _signal_inside_the_statement(worker: Proc, signum: int, lock: RowLock) -> None:
    """Deliver ``signum`` while a statement of the worker waits on ``lock``, then release it.

    psycopg runs Python's signal handler while it waits for the server, so on PostgreSQL the
    SIGTERM is taken (logged) before the statement returns; mysqlclient waits in C and the
    handler runs once the statement returned, so on MariaDB the log line comes after.
    """
    worker.send(signum)
    if signum == signal.SIGKILL:
        assert worker.wait(10) == -signal.SIGKILL
    elif is_postgres():
        wait_for(lambda: "claiming no more" in worker.stderr(), timeout=30, what=worker.tail)
    assert worker.alive() == (signum == signal.SIGTERM)
    lock.release()
    if signum == signal.SIGTERM:
        wait_for(lambda: "claiming no more" in worker.stderr(), timeout=30, what=worker.tail)


def _rerun_after_the_lease(*jobs: Job) -> None:
    """A killed worker's leases lapse; a worker in this process reclaims and runs them."""
    wait_for(lease_lapsed(*jobs), timeout=30, what="the killed worker's leases to lapse")
    run_burst()


def _rerun_past_the_lease(*jobs: Job) -> None:
    """As :func:`_rerun_after_the_lease` for a long lease: on the package's clock, past it."""
    leases = [lease for job in jobs if (lease := Job.objects.get(pk=job.pk).lease_expires_at)]
    with time_machine.travel(max(leases, default=timezone.now()) + timedelta(seconds=1)):
        run_burst()


# -- idle -------------------------------------------------------------------------------


@SIGNALS_KILL_ONCE
def test_idle(tmp_path, signum):
    done = work.delay("done")
    later = work.delay("later")
    Job.objects.filter(pk=later.pk).update(run_at=timezone.now() + timedelta(hours=1))
    untouched = claim_fields(later)
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(
            alive_or_fail(worker, lambda: row(done) == (Status.SUCCESSFUL, 1)),
            timeout=60,
            what="the due job to run and be written",
        )
        worker.send(signum)
        assert worker.wait(30) == exit_status(signum), worker.tail()
    if signum == signal.SIGTERM:
        assert "stopped after 1 job(s)" in worker.stderr(), worker.tail()
    assert row(done) == (Status.SUCCESSFUL, 1) and runs(done) == 1
    assert claim_fields(later) == untouched
    assert not Job.objects.filter(status=Status.RUNNING).exists()


# -- inside the claim (SIGTERM: test_worker_shutdown.py) ----------------------------------


@pytest.mark.postgres
def test_sigkill_inside_the_claim(tmp_path):
    retried = work.delay("retried")
    Job.objects.filter(pk=retried.pk).update(attempts=1, error="builtins.ValueError: first run")
    fresh = work.delay("fresh")
    before = {job.pk: Job.objects.get(pk=job.pk).attempts for job in (retried, fresh)}
    name = app_name("claim-kill")
    env = child_env(DEBOUNCE_TEST_APP_NAME=name, DEBOUNCE_TEST_LEASE="2s")
    with table_locked() as holder, processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        wait_for(
            alive_or_fail(worker, lambda: claim_waits_on_lock(name)),
            timeout=60,
            what=lambda: f"the claim to wait\n{worker.tail()}",
        )
        worker.send(signal.SIGKILL)
        assert worker.wait(10) == -signal.SIGKILL
        holder.rollback()  # the claim statement now runs, for a client that is gone
        wait_for(lambda: not pg_backends(name), timeout=30, what="the killed worker's sessions")
    # The statement ran to its commit once the lock went: the claim holds for a dead client.
    for job in (retried, fresh):
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Status.RUNNING, before[job.pk] + 1)
        assert job.worker_id.split(":")[1] == str(worker.pid)
    assert not CallLog.objects.exists()
    _rerun_after_the_lease(retried, fresh)
    for job in (retried, fresh):
        assert row(job) == (Status.SUCCESSFUL, before[job.pk] + 2)  # the claim's attempt spent
        assert runs(job) == 1  # its first run: the killed claim never started it


# -- between the claim and the start --------------------------------------------------------


@SIGNALS_KILL_ONCE
def test_between_claim_and_start(tmp_path, signum):
    opened = tmp_path / "gate"
    env = {
        "DEBOUNCE_TEST_PREFETCH": "3",
        "DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL": "60",
        "DEBOUNCE_TEST_LEASE": "2s",
    }
    # A no-op's run time (well under 0.2 s / 3) makes the worker claim three jobs ahead; alone
    # in the queue, the claim after it comes back short and writes its success.
    quick = noop.delay()
    with processes(tmp_path, child_env(**env)) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(alive_or_fail(worker, lambda: row(quick)[0] == Status.SUCCESSFUL), timeout=60)
        with transaction.atomic():
            held = gate.delay("held", str(opened))
            ahead = [work.delay(f"ahead{i}") for i in range(3)]
        before = {job.pk: claim_fields(job) for job in ahead}
        ids = [job.pk for job in ahead]
        # The gate job's claim was full, so while it runs the worker claims three ahead.
        wait_for(
            alive_or_fail(
                worker,
                lambda: (
                    runs(held) == 1
                    and Job.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 3
                ),
            ),
            timeout=60,
            what=lambda: f"the gate job to run with three claimed behind it\n{worker.tail()}",
        )
        _stop(worker, signum)
        if signum == signal.SIGTERM:
            # Put back at once, while the gate job still runs: not after the grace period.
            wait_for(
                lambda: Job.objects.filter(pk__in=ids, status=Status.READY).count() == 3,
                timeout=30,
                what=lambda: f"the claimed jobs to go back\n{worker.tail()}",
            )
            assert runs(held, finished=False) == 1
        touch(opened)
        assert worker.wait(60) == exit_status(signum), worker.tail()

    if signum == signal.SIGTERM:
        assert "put back 3 claimed job(s)" in worker.stderr(), worker.tail()
        assert {job.pk: claim_fields(job) for job in ahead} == before
        assert row(held) == (Status.SUCCESSFUL, 1) and runs(held) == 1
        assert not CallLog.objects.filter(job_id__in=ids).exists()
    else:
        # Nothing in the database tells a claimed job from a started one: an attempt each.
        assert [row(job) for job in (held, *ahead)] == [(Status.RUNNING, 1)] * 4
        _rerun_after_the_lease(held, *ahead)
        assert [row(job) for job in (held, *ahead)] == [(Status.SUCCESSFUL, 2)] * 4
        assert [runs(job) for job in (held, *ahead)] == [2, 1, 1, 1]
        assert runs(held, finished=False) == 1  # the killed run never ended
    assert row(quick) == (Status.SUCCESSFUL, 1)


# -- mid-job (SIGKILL: test_worker_shutdown.py::test_sigkill_mid_job_loses_nothing) --------


def test_sigterm_mid_job(tmp_path):
    opened = tmp_path / "gate"
    held = gate.delay("held", str(opened))
    behind = work.delay("behind")
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(alive_or_fail(worker, lambda: runs(held) == 1), timeout=60, what="the run")
        _stop(worker, signal.SIGTERM)
        assert worker.alive() and row(held) == (Status.RUNNING, 1)
        touch(opened)
        assert worker.wait(60) == 0, worker.tail()
    assert row(held) == (Status.SUCCESSFUL, 1) and runs(held, finished=True) == 1
    assert Job.objects.get(pk=held.pk).result == {"pid": worker.pid, "tag": "held"}
    assert row(behind) == (Status.READY, 0) and runs(behind) == 0


# -- between the run and the batched success write, and during the flush -----------------


def _pending_successes(tmp_path, procs, *, lease: str):
    """A worker with one written success, two waiting for their write, a gate job running."""
    opened = tmp_path / "gate"
    env = {
        "DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL": "60",
        "DEBOUNCE_TEST_PREFETCH": "0",
        "DEBOUNCE_TEST_LEASE": lease,
    }
    written = work.delay("written")
    worker = procs.worker("--poll-interval", "0.05", env=env)
    # Alone in the queue: the claim after it comes back short and writes it.
    wait_for(alive_or_fail(worker, lambda: row(written)[0] == Status.SUCCESSFUL), timeout=60)
    with transaction.atomic():  # all due at once: no claim comes back short until the gate
        pending = [work.delay(f"pending{i}") for i in range(2)]
        held = gate.delay("held", str(opened))
    wait_for(
        alive_or_fail(
            worker,
            lambda: runs(held) == 1 and all(runs(job, finished=True) == 1 for job in pending),
        ),
        timeout=60,
        what=lambda: f"two runs to return and the gate job to start\n{worker.tail()}",
    )
    assert [row(job) for job in pending] == [(Status.RUNNING, 1)] * 2  # not written yet
    return worker, written, pending, held, opened


@SIGNALS_KILL_ONCE
def test_between_run_and_the_batched_success_write(tmp_path, signum):
    with processes(tmp_path, child_env()) as procs:
        worker, written, pending, held, opened = _pending_successes(tmp_path, procs, lease="2s")
        written_at = Job.objects.get(pk=written.pk).finished_at
        _stop(worker, signum)
        if signum == signal.SIGTERM:
            # Written at the signal, while the gate job still runs (not when the worker exits).
            wait_for(
                lambda: all(row(job)[0] == Status.SUCCESSFUL for job in pending),
                timeout=30,
                what=lambda: f"the pending successes to be written\n{worker.tail()}",
            )
            assert runs(held, finished=False) == 1
        touch(opened)
        assert worker.wait(60) == exit_status(signum), worker.tail()

    if signum == signal.SIGTERM:
        assert [row(job) for job in (*pending, held)] == [(Status.SUCCESSFUL, 1)] * 3
        assert [runs(job) for job in (*pending, held)] == [1, 1, 1]
    else:
        assert [row(job) for job in (*pending, held)] == [(Status.RUNNING, 1)] * 3
        _rerun_after_the_lease(*pending, held)
        assert [row(job) for job in (*pending, held)] == [(Status.SUCCESSFUL, 2)] * 3
        assert [runs(job) for job in (*pending, held)] == [2, 2, 2]
        for job in pending:
            assert Job.objects.get(pk=job.pk).result == {"pid": os.getpid(), "tag": job.args[0]}
    assert runs(written) == 1 and Job.objects.get(pk=written.pk).finished_at == written_at


@pytest.mark.row_locks
@SIGNALS
def test_during_the_flush(tmp_path, signum):
    # A long lease: no renewal (every 100 s) waits on the row lock before the flush does.
    with processes(tmp_path, child_env()) as procs:
        worker, _, pending, held, opened = _pending_successes(tmp_path, procs, lease="300s")
        with RowLock(pending[0].pk) as lock:
            touch(opened)  # the gate job returns; the claim after it is short: it flushes
            wait_for(
                alive_or_fail(worker, lambda: statement_waits(FLUSH)),
                timeout=60,
                interval=0.25,
                what=lambda: f"the batched success write to wait\n{worker.tail()}",
            )
            assert [row(job)[0] for job in (*pending, held)] == [Status.RUNNING] * 3
            _signal_inside_the_statement(worker, signum, lock)
        assert worker.wait(60) == exit_status(signum), worker.tail()
        wait_for(lambda: other_sessions() == 0, timeout=30, what="the worker's sessions to end")

    # Also after a SIGKILL: the server ran the waiting UPDATE to its commit once the lock went
    # (PostgreSQL and MariaDB notice a gone client only when they answer it).
    assert [row(job) for job in (*pending, held)] == [(Status.SUCCESSFUL, 1)] * 3
    if signum == signal.SIGKILL:
        _rerun_past_the_lease(*pending, held)  # a reclaim past the lease finds nothing to rerun
        assert [row(job) for job in (*pending, held)] == [(Status.SUCCESSFUL, 1)] * 3
    assert [runs(job) for job in (*pending, held)] == [1, 1, 1]


# -- during a lease renewal -------------------------------------------------------------


@pytest.mark.row_locks
@SIGNALS
def test_during_lease_renewal(tmp_path, signum):
    opened = tmp_path / "gate"
    held = gate.delay("held", str(opened))
    env = child_env(DEBOUNCE_TEST_LEASE="3s")  # renewed every second
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(alive_or_fail(worker, lambda: runs(held) == 1), timeout=60, what="the run")
        with RowLock(held.pk) as lock:
            wait_for(
                alive_or_fail(worker, lambda: statement_waits(RENEWAL)),
                timeout=60,
                interval=0.25,
                what=lambda: f"the lease renewal to wait\n{worker.tail()}",
            )
            _signal_inside_the_statement(worker, signum, lock)
        touch(opened)
        assert worker.wait(60) == exit_status(signum), worker.tail()
        wait_for(lambda: other_sessions() == 0, timeout=30, what="the worker's sessions to end")

    if signum == signal.SIGTERM:
        assert row(held) == (Status.SUCCESSFUL, 1) and runs(held) == 1
    else:
        assert row(held) == (Status.RUNNING, 1)
        _rerun_after_the_lease(held)
        assert row(held) == (Status.SUCCESSFUL, 2)
        assert (runs(held), runs(held, finished=False)) == (2, 1)
