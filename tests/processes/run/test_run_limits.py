"""A real ``run_debounce_worker`` process: a stuck job's thread retired, a running job cancelled.

Issue #22 items 2 and 3 (decisions 186, 187). The worker runs one job thread; a
job that hangs without a checkpoint passes its hard limit (``timeout=0.2`` plus
a 0.2 s grace), a fresh thread runs the next job, and a second stuck thread (one
more than ``DEBOUNCE_MAX_STUCK_THREADS=1``) makes the worker exit 75. A job
sleeping in checkpointed steps is cancelled from the test's connection.
"""

from __future__ import annotations

import signal

import pytest

from django_debounce import enqueue
from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

Status = Job.Status
TIMEOUT_ERROR = "django_debounce.exceptions.JobTimeout: "


def test_stuck_threads_are_replaced_then_the_worker_exits_75(tmp_path):
    first = enqueue("wrk.hangs", args=[30])
    between = enqueue("wrk.tag", args=["between"])
    second = enqueue("wrk.hangs", args=[30])
    env = child_env(DEBOUNCE_TEST_TIMEOUT_GRACE="0.2", DEBOUNCE_TEST_MAX_STUCK_THREADS="1")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "1", "--poll-interval", "0.05")
        assert worker.wait(60) == 75, worker.tail()
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert statuses == {first.pk: "FAILED", between.pk: "SUCCESSFUL", second.pk: "FAILED"}
    assert Job.objects.get(pk=first.pk).error.startswith(TIMEOUT_ERROR)
    assert "stuck threads (DEBOUNCE_MAX_STUCK_THREADS=1)" in worker.stderr()


def test_a_running_job_is_cancelled_from_another_connection(tmp_path):
    job = enqueue("wrk.steps", args=[30])
    env = child_env(DEBOUNCE_TEST_CANCEL_POLL_INTERVAL="0.05")
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.05")
        wait_for(
            lambda: CallLog.objects.filter(task="wrk.steps").exists(),
            timeout=60,
            what=lambda: worker.tail(),
        )
        assert job.cancel().requested == [job.pk]
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == Status.CANCELLED,
            timeout=10,
            what=lambda: worker.tail(),
        )
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.tail()
    job.refresh_from_db()
    assert job.error.startswith("django_debounce.exceptions.JobCancelled: ")
