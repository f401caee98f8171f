"""SIGTERM and SIGKILL at every phase of a real Celery dispatcher (issue #18 item 2; §7).

``run_debounce_worker --dispatch-only`` claims due jobs for a hand-off and publishes one
Celery message per job (decision 87); the jobs run in a real ``celery worker``
(tests/processes/celery_rig.py, on the local Redis). The dispatcher runs no job, so the
phases that exist for it are the four below; the phases of a run (the batched success
write, its flush, lease renewal) are the built-in worker's
(``test_signals_at_every_phase.py``), and a Celery worker killed mid-job is
``test_celery_executor.py::test_a_celery_worker_killed_mid_job_leaves_a_job_that_runs_again_after_its_lease``.

=====================  =======  ==================================================  =============================================
phase                  signal   how the test reaches it                             what is asserted
=====================  =======  ==================================================  =============================================
idle                   TERM     its one due job is handed off and its message       exit 0 (-9); the message survives it: a
                       KILL     waits in the broker; nothing else is due            Celery worker started after runs the job
                                                                                    once; a job enqueued after it stays READY
inside the claim       TERM     outside ``LOCK TABLE … EXCLUSIVE`` holds the claim  exit 0; both jobs READY at once as before the
                                statement; ``pg_stat_activity`` shows it waiting    claim (attempts, started_at), nothing
                                (PostgreSQL)                                        published; dispatched again, each runs once
                       KILL     the same                                            -9; the claim commits server-side: both
                                                                                    handed off, nothing published; once the
                                                                                    hand-off lease lapses they go back with the
                                                                                    attempt not counted; each then runs once
between claim and      TERM     the broker URL is a closed port: the claim          exit 0; the jobs never tried go back READY at
publish                         committed, its publishes fail one by one ("could    once; the ones whose publish failed wait for
                                not publish job" in the log)                        their hand-off lease; all run exactly once
                       KILL     the same                                            -9; all handed off, none published; after the
                                                                                    hand-off lease each runs exactly once,
                                                                                    attempt 1
mid-job (on Celery)    TERM     a gate job handed off runs in the Celery worker     exit 0 (-9); the run goes on: it ends once,
                       KILL                                                         SUCCESSFUL, attempt 1; a job enqueued after
                                                                                    the dispatcher stopped stays READY
=====================  =======  ==================================================  =============================================
"""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import Iterator

import pytest

from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.models import Job
from django_debounce.run import leases
from tests.processes.celery_rig import CeleryRig
from tests.processes.signal_phases import (
    alive_or_fail,
    claim_fields,
    claim_waits_on_lock,
    exit_status,
    lease_lapsed,
    row,
    runs,
    table_locked,
    touch,
)
from tests.procs import Processes, app_name, pg_backends, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery import gate, record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"]
)
Status = Job.Status
#: Short, so a test waits little for a hand-off nobody took to lapse.
HANDOFF_LEASE = "2s"


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with processes(tmp_path, {}) as group:
        yield group


@pytest.fixture
def rig(procs: Processes, settings) -> Iterator[CeleryRig]:
    built = CeleryRig("redis", procs, DEBOUNCE_TEST_HANDOFF_LEASE=HANDOFF_LEASE)
    for name, value in built.settings().items():
        setattr(settings, name, value)
    yield built
    procs.kill_all()
    built.close()


def _handed_off(job: Job) -> bool:
    job = Job.objects.get(pk=job.pk)
    return job.status == Status.RUNNING and job.worker_id.startswith(leases.HANDOFF_PREFIX)


def _dispatch_and_run(rig: CeleryRig, jobs: list[Job]) -> None:
    """Hand ``jobs`` (READY again) to a real Celery worker from this process; wait until run."""
    rig.worker()
    assert celery_executor.dispatch_due(app=rig.app) == len(jobs)
    ids = [job.pk for job in jobs]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=Status.SUCCESSFUL).count() == len(ids),
        timeout=90,
        what=rig.procs.tails,
    )


def _lapse_and_reclaim(jobs: list[Job]) -> None:
    """The hand-off lease of ``jobs`` lapses; the reclaim puts them back, attempt not counted."""
    wait_for(lease_lapsed(*jobs), timeout=30, what="the hand-off leases to lapse")
    leases.reclaim_expired_leases()


@SIGNALS
def test_idle(rig, signum):
    # A long hand-off lease: the message waits in the broker until a Celery worker starts.
    rig.env["DEBOUNCE_TEST_HANDOFF_LEASE"] = "5m"
    job = record.delay("handed")
    dispatcher = rig.dispatcher("--poll-interval", "0.05")
    wait_for(
        alive_or_fail(dispatcher, lambda: _handed_off(job) and rig.waiting() == 1),
        timeout=60,
        what=lambda: f"the job to be handed off\n{dispatcher.tail()}",
    )
    dispatcher.send(signum)
    assert dispatcher.wait(30) == exit_status(signum), dispatcher.tail()
    if signum == signal.SIGTERM:
        assert "stopped after 1 hand-off(s)" in dispatcher.stderr(), dispatcher.tail()
    late = record.delay("late")
    worker = rig.worker()
    wait_for(lambda: row(job)[0] == Status.SUCCESSFUL, timeout=60, what=rig.procs.tails)
    assert row(job) == (Status.SUCCESSFUL, 1) and runs(job) == 1
    assert Job.objects.get(pk=job.pk).result == {"tag": "handed", "pid": worker.pid}
    assert row(late) == (Status.READY, 0) and runs(late) == 0


@SIGNALS
def test_inside_the_claim(rig, signum):
    retried = record.delay("retried")
    Job.objects.filter(pk=retried.pk).update(attempts=1, error="builtins.ValueError: first run")
    jobs = [retried, record.delay("fresh")]
    before = {job.pk: claim_fields(job) for job in jobs}
    name = app_name("dispatch-claim")
    rig.env["DEBOUNCE_TEST_APP_NAME"] = name
    with table_locked() as holder:
        dispatcher = rig.dispatcher("--poll-interval", "0.05")
        wait_for(
            alive_or_fail(dispatcher, lambda: claim_waits_on_lock(name)),
            timeout=60,
            what=lambda: f"the claim to wait\n{dispatcher.tail()}",
        )
        dispatcher.send(signum)
        if signum == signal.SIGTERM:
            wait_for(
                lambda: "stopping the dispatcher" in dispatcher.stderr(),
                timeout=30,
                what=dispatcher.tail,
            )
        else:
            assert dispatcher.wait(10) == -signal.SIGKILL
        holder.rollback()  # the claim statement now returns its jobs
        assert dispatcher.wait(30) == exit_status(signum), dispatcher.tail()
        wait_for(lambda: not pg_backends(name), timeout=30, what="the dispatcher's sessions")
    assert rig.waiting() == 0  # nothing published
    if signum == signal.SIGTERM:
        assert "put back 2 claimed job(s)" in dispatcher.stderr(), dispatcher.tail()
        assert {job.pk: claim_fields(job) for job in jobs} == before
    else:
        assert all(_handed_off(job) for job in jobs)
        _lapse_and_reclaim(jobs)
        assert [row(job) for job in jobs] == [(Status.READY, 1), (Status.READY, 0)]
    _dispatch_and_run(rig, jobs)
    assert [row(job) for job in jobs] == [(Status.SUCCESSFUL, 2), (Status.SUCCESSFUL, 1)]
    assert [runs(job) for job in jobs] == [1, 1]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@SIGNALS
def test_between_claim_and_publish(rig, signum):
    jobs = [record.delay(f"unpublished-{i}") for i in range(20)]
    # Each publish to a closed port fails after Celery's publish retries (about 0.6 s each).
    env = dict(rig.env, DEBOUNCE_TEST_BROKER=f"redis://127.0.0.1:{_closed_port()}/0")
    dispatcher = rig.procs.worker(
        "--dispatch-only", "--poll-interval", "0.05", name="dispatcher", env=env
    )
    wait_for(
        alive_or_fail(dispatcher, lambda: "could not publish job" in dispatcher.stderr()),
        timeout=60,
        what=dispatcher.tail,
    )
    assert all(_handed_off(job) for job in jobs)  # one claim took all twenty
    dispatcher.send(signum)
    assert dispatcher.wait(30) == exit_status(signum), dispatcher.tail()
    failed = {int(pk) for pk in re.findall(r"could not publish job (\d+)", dispatcher.stderr())}
    assert 1 <= len(failed) < len(jobs), dispatcher.tail()
    if signum == signal.SIGTERM:
        put_back = [job for job in jobs if job.pk not in failed]
        assert f"put back {len(put_back)} claimed job(s)" in dispatcher.stderr()
        assert [row(job) for job in put_back] == [(Status.READY, 0)] * len(put_back)
        assert all(_handed_off(job) for job in jobs if job.pk in failed)
    else:
        assert all(_handed_off(job) for job in jobs)
    _lapse_and_reclaim(jobs)
    assert [row(job) for job in jobs] == [(Status.READY, 0)] * len(jobs)
    _dispatch_and_run(rig, jobs)
    assert [row(job) for job in jobs] == [(Status.SUCCESSFUL, 1)] * len(jobs)
    assert [runs(job) for job in jobs] == [1] * len(jobs)


@SIGNALS
def test_mid_job_on_celery(rig, signum, tmp_path):
    opened = tmp_path / "gate"
    held = gate.delay("held", str(opened))
    worker = rig.worker()
    dispatcher = rig.dispatcher("--poll-interval", "0.05")
    wait_for(
        alive_or_fail(dispatcher, lambda: runs(held) == 1),
        timeout=60,
        what=rig.procs.tails,
    )
    dispatcher.send(signum)
    assert dispatcher.wait(30) == exit_status(signum), dispatcher.tail()
    late = record.delay("late")
    assert row(held) == (Status.RUNNING, 1) and runs(held, finished=False) == 1
    touch(opened)
    wait_for(lambda: row(held)[0] == Status.SUCCESSFUL, timeout=60, what=rig.procs.tails)
    assert row(held) == (Status.SUCCESSFUL, 1) and runs(held, finished=True) == 1
    assert Job.objects.get(pk=held.pk).result == {"tag": "held", "pid": worker.pid}
    assert row(late) == (Status.READY, 0) and runs(late) == 0
    assert not CallLog.objects.exclude(job_id=held.pk).exists()
