"""A task that raises ``SystemExit``, ``KeyboardInterrupt`` or ``CancelledError`` has failed (issue #17 item 7).

Decision 150: ``run_job`` records such a run like any error (a retry, or a dead
letter once the task's retries are spent; the error ``"SystemExit: 3"``), and the
thread that ran it goes on to the next job. Before, ``run_job`` re-raised it: in
the inline ``--burst`` it ended the command (exit status 3) with the job RUNNING,
and in the threaded worker it killed the job thread while the loop kept claiming
and renewing leases, so with one thread every later job stayed RUNNING forever.
Only the worker's own second signal (``WorkerExit``) still ends the run.
"""

from __future__ import annotations

import threading

import pytest

from django_debounce import enqueue
from django_debounce.models import DeadLetter, Job
from django_debounce.worker.loop import Worker
from tests.testapp.models import CallLog

Status = Job.Status

#: What each kind raises, as a dead letter's ``error`` holds it (§11).
ERRORS = {
    "exit": "SystemExit: 3",
    "interrupt": "KeyboardInterrupt: pressed",
    "cancelled": "asyncio.exceptions.CancelledError: cancelled",
}
TASKS = ["wrk.raises_base", "wrk.async_raises_base"]


def _assert_failed_for_good(job: Job, error: str) -> None:
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.status, job.attempts, job.lease_expires_at) == (Status.FAILED, 1, None)
    assert (job.error, letter.error) == (error, error)
    assert letter.reason == f"failed: 1 attempt(s); {error}"
    assert error.split(":")[0].rsplit(".", 1)[-1] in letter.traceback


@pytest.mark.django_db
@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_an_inline_burst_records_the_failure_and_runs_the_later_job(burst, name, kind):
    bad = enqueue(name, args=[kind])
    later = enqueue("wrk.tag", args=["later"])
    burst()  # before: SystemExit/KeyboardInterrupt/CancelledError out of the command
    _assert_failed_for_good(bad, ERRORS[kind])
    later.refresh_from_db()
    assert (later.status, later.result) == (Status.SUCCESSFUL, "later")
    assert CallLog.objects.filter(task=name, key=kind).count() == 1


@pytest.mark.django_db
def test_an_async_task_that_cancels_itself_has_failed(burst):
    bad = enqueue("wrk.async_raises_base", args=["self_cancel"])
    burst()
    bad.refresh_from_db()
    assert (bad.status, bad.error) == (Status.FAILED, "asyncio.exceptions.CancelledError: ")


@pytest.mark.django_db
def test_with_retries_left_sys_exit_schedules_a_retry(burst, clock):
    bad = enqueue("wrk.raises_base", args=["exit"], max_retries=1)
    burst()
    bad.refresh_from_db()
    assert (bad.status, bad.attempts, bad.error) == (Status.READY, 1, "SystemExit: 3")
    assert bad.run_at > clock(seconds=0) and bad.worker_id == ""
    assert not DeadLetter.objects.exists()
    clock(at=bad.run_at)
    burst()
    _assert_failed_for_good_after(bad, attempts=2)


def _assert_failed_for_good_after(job: Job, *, attempts: int) -> None:
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.FAILED, attempts)
    assert DeadLetter.objects.get(job=job).reason == f"failed: {attempts} attempt(s); SystemExit: 3"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_a_threaded_worker_keeps_its_only_thread_and_runs_the_later_job(kind):
    bad = enqueue("wrk.raises_base", args=[kind])
    later = enqueue("wrk.tag", args=["later"])
    worker = Worker(concurrency=1, max_jobs=2, poll_interval=0.05, handle_signals=False)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(10)
    if runner.is_alive():  # before: the job thread died; the later job sat RUNNING
        worker.stop()
        runner.join(30)
        later.refresh_from_db()
        pytest.fail(f"the worker never finished; the later job is {later.status}")
    _assert_failed_for_good(bad, ERRORS[kind])
    later.refresh_from_db()
    assert (later.status, later.result) == (Status.SUCCESSFUL, "later")
    assert worker.processed == 2


@pytest.mark.django_db
def test_the_workers_second_signal_in_a_task_still_ends_the_run_and_puts_the_rest_back(
    burst, settings
):
    settings.DEBOUNCE_PREFETCH = 10
    first = [enqueue("wrk.tag", args=[f"first{i}"]) for i in range(3)]
    stop = enqueue("wrk.raises_base", args=["worker_exit"])
    rest = [enqueue("wrk.tag", args=[f"rest{i}"]) for i in range(2)]
    with pytest.raises(SystemExit):
        burst()
    stop.refresh_from_db()
    # Not the task's error: the process ends, the job runs again after its lease (§7).
    assert (stop.status, stop.attempts, stop.error) == (Status.RUNNING, 1, "")
    assert stop.lease_expires_at is not None
    assert not DeadLetter.objects.exists()
    statuses = dict(
        Job.objects.filter(pk__in=[j.pk for j in first + rest]).values_list("pk", "status")
    )
    assert [statuses[j.pk] for j in first] == [Status.SUCCESSFUL] * 3
    # Claimed ahead with it and never started: back to READY at once, the attempt not counted.
    assert [
        (j.status, j.attempts, j.worker_id)
        for j in Job.objects.filter(pk__in=[r.pk for r in rest]).order_by("pk")
    ] == [(Status.READY, 0, "")] * 2
