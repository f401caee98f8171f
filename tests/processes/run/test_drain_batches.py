"""A draining worker process with prefetch and batched successes (issue #12 item 2; §7, §11).

* SIGKILL after a job returned but before its success was written: the job is still
  RUNNING; once its lease lapses another worker runs it again (at least once).
* SIGTERM: the successes waiting for their write are written, the jobs claimed ahead
  and not started go back to READY as before their claim, the running job finishes.
"""

from __future__ import annotations

import signal

import pytest
from django.utils import timezone

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import Proc, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import work

pytestmark = pytest.mark.django_db(transaction=True)


def _ran(job: Job, worker: Proc, runs: int = 1):
    """The job's run has ended ``runs`` times; fail at once, with the log, if the worker died."""

    def check() -> bool:
        if CallLog.objects.filter(job_id=job.pk, finished_at__isnull=False).count() >= runs:
            return True
        assert worker.alive(), f"the worker exited {worker.popen.poll()}\n{worker.tail()}"
        return False

    return check


def test_sigkill_before_the_flush_runs_the_job_again(tmp_path):
    job = work.delay("unwritten")
    long = work.delay("long", seconds=60)
    fillers = [work.delay(f"filler{i}") for i in range(3)]
    # A minute between flushes, and a busy queue: the claim after ``job`` takes ``long`` and
    # two jobs ahead (prefetch 2) and comes back full, so nothing writes the success early
    # (a claim that comes back short writes the pending successes at once).
    env = child_env(
        DEBOUNCE_TEST_LEASE="2s",
        DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL="60",
        DEBOUNCE_TEST_PREFETCH="2",
    )
    with processes(tmp_path, env) as procs:
        first = procs.worker("--poll-interval", "0.05", name="first")
        wait_for(_ran(job, first), timeout=30, what="the job to run")
        wait_for(
            lambda: CallLog.objects.filter(job_id=long.pk).exists(),
            timeout=30,
            what=lambda: f"the long job to start\n{first.tail()}",
        )
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        job.refresh_from_db()
        assert (job.status, job.attempts, job.result) == (Job.Status.RUNNING, 1, None)

        wait_for(
            lambda: timezone.now() > Job.objects.get(pk=job.pk).lease_expires_at,
            timeout=10,
            what="the lease to lapse",
        )
        second = procs.worker("--burst", name="second", env={"REL_SLEEP_SCALE": "0"})
        assert second.wait(60) == 0, second.tail()

    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 2)
    assert job.result == {"pid": second.pid, "tag": "unwritten"}
    runs = CallLog.objects.filter(job_id=job.pk).order_by("id")
    assert [log.pid for log in runs] == [first.pid, second.pid]
    assert (
        Job.objects.filter(pk__in=[long.pk, *(f.pk for f in fillers)], status="SUCCESSFUL").count()
        == 4
    )


def test_sigterm_writes_the_successes_and_puts_the_prefetched_jobs_back(tmp_path):
    quick = work.delay("quick")
    long = work.delay("long", seconds=10)
    ahead = [work.delay(f"ahead{i}") for i in range(5)]
    env = child_env(DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL="60", DEBOUNCE_TEST_PREFETCH="5")
    with processes(tmp_path, env) as procs:
        # The first claim (an idle queue) takes one job: ``quick``. It came back full, so the
        # next one prefetches: ``long`` for the free thread and the five others ahead.
        worker = procs.worker("--poll-interval", "0.05")
        wait_for(_ran(quick, worker), timeout=30, what="the quick job to run")
        wait_for(
            lambda: CallLog.objects.filter(job_id=long.pk).exists(),
            timeout=30,
            what=lambda: f"the long job to start\n{worker.tail()}",
        )
        assert Job.objects.get(pk=quick.pk).status == Job.Status.RUNNING  # not written yet
        # How many a claim takes ahead follows how long the last runs took (a loaded machine
        # takes fewer at first); the worker fills its prefetch while ``long`` runs.
        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in ahead], status="RUNNING").count() == 5,
            timeout=8,
            what=lambda: f"the five jobs ahead to be claimed\n{worker.tail()}",
        )
        assert CallLog.objects.filter(job_id=long.pk, finished_at__isnull=True).exists()
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.tail()
    log = worker.stderr()
    assert "put back 5 claimed job(s)" in log, log
    assert log.index(f"job {quick.pk} (rel.work) succeeded") < log.index("put back 5"), log
    for job in (quick, long):
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 1)
    for job in ahead:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.worker_id, job.started_at) == (
            Job.Status.READY,
            0,
            "",
            None,
        )
    assert not CallLog.objects.filter(job_id__in=[j.pk for j in ahead]).exists()
