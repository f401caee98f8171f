"""A worker process outlives a task that calls ``sys.exit()`` or raises ``KeyboardInterrupt`` (issue #17 item 7).

The real ``run_debounce_worker`` command, its signal handlers installed, in both
modes: the threaded loop with one job thread, and the inline ``--burst``. The bad
job ends with its dead letter (decision 150) and the job after it still runs.
Before, the threaded worker's only job thread died and every later job sat RUNNING
under a live worker renewing its lease; the burst exited with status 3.
"""

from __future__ import annotations

import signal

import pytest

from django_debounce import enqueue
from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.procs import Proc, processes, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status


def _succeeded(job: Job, worker: Proc):
    def check() -> bool:
        assert worker.alive(), f"the worker exited {worker.popen.poll()}\n{worker.tail()}"
        return Job.objects.get(pk=job.pk).status == Status.SUCCESSFUL

    return check


def _letters() -> dict[int, str]:
    return dict(DeadLetter.objects.values_list("job_id", "error"))


def test_a_threaded_worker_with_one_thread_runs_the_jobs_after_sys_exit(tmp_path):
    exits = enqueue("wrk.raises_base", args=["exit"])
    interrupts = enqueue("wrk.raises_base", args=["interrupt"])
    later = enqueue("wrk.tag", args=["later"])
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--concurrency", "1", "--poll-interval", "0.05")
        wait_for(_succeeded(later, worker), timeout=60, what=lambda: worker.tail())
        # Still serving: a job enqueued now runs too.
        again = enqueue("wrk.tag", args=["again"])
        wait_for(_succeeded(again, worker), timeout=60, what=lambda: worker.tail())
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.tail()
    assert _letters() == {
        exits.pk: "SystemExit: 3",
        interrupts.pk: "KeyboardInterrupt: pressed",
    }
    assert Job.objects.filter(status=Status.RUNNING).count() == 0


def test_an_inline_burst_runs_the_job_after_sys_exit_and_exits_0(tmp_path):
    exits = enqueue("wrk.raises_base", args=["exit"])
    later = enqueue("wrk.tag", args=["later"])
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--burst")
        assert worker.wait(60) == 0, worker.tail()  # before: 3, from the task's sys.exit(3)
    later.refresh_from_db()
    assert (later.status, later.result) == (Status.SUCCESSFUL, "later")
    assert _letters() == {exits.pk: "SystemExit: 3"}
