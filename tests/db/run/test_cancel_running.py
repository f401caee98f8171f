"""Cancelling a running job (issue #22 item 3, decision 186): the mark, the context, the end.

Real jobs run in a real threaded worker (``burst``, two threads) while the test
thread, on its own connection, asks for the cancel; the tasks sleep in steps of
10 ms, and the context reads the mark every 20 ms (``DEBOUNCE_CANCEL_POLL_INTERVAL``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.context import JobContext
from django_debounce.exceptions import JobCancelled
from django_debounce.models import DeadLetter, Job
from django_debounce.ops.cancels import cancel_jobs
from django_debounce.run_controls import RunControl
from django_debounce.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status
STARTED = threading.Event()
RAN: list[str] = []


@pytest.fixture(autouse=True)
def _fast_poll(settings):
    settings.DEBOUNCE_CANCEL_POLL_INTERVAL = 0.02
    STARTED.clear()
    RAN.clear()


@task(name="tl.steps", takes_context=True, max_retries=3)
def steps(context: JobContext, count: int = 500) -> str:
    STARTED.set()
    for _ in range(count):
        context.checkpoint()
        time.sleep(0.01)
    return "done"


@task(name="tl.deaf", takes_context=True, max_retries=3)
def deaf(context: JobContext, count: int) -> str:
    STARTED.set()
    for _ in range(count):
        time.sleep(0.01)
    return "ran to its end"


@task(name="tl.fails_when_asked", takes_context=True, max_retries=3)
def fails_when_asked(context: JobContext) -> None:
    STARTED.set()
    while not context.cancel_requested:
        time.sleep(0.01)
    raise ValueError("cleanup went wrong")


@task(name="tl.asleep", max_retries=3)
async def asleep() -> str:
    STARTED.set()
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        RAN.append("cancelled")
        raise
    return "woke"


@task(name="tl.noted")
def noted() -> None:
    RAN.append("noted")


def _worker() -> threading.Thread:
    worker = Worker(burst=True, concurrency=2, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def _cancel_while_running(job: Job) -> tuple[Job, float]:
    thread = _worker()
    assert STARTED.wait(5)
    asked = time.monotonic()
    result = job.cancel()
    assert result.requested == [job.pk]
    thread.join(5)
    assert not thread.is_alive()
    job.refresh_from_db()
    return job, time.monotonic() - asked


def test_a_running_job_stops_at_its_checkpoint_and_ends_cancelled():
    job, took = _cancel_while_running(steps.delay())
    assert job.status == Status.CANCELLED
    assert job.error.startswith("django_debounce.exceptions.JobCancelled: ")
    assert job.attempts == 1
    assert job.cancel_requested_at is not None
    assert job.finished_at is not None and job.lease_expires_at is None
    assert DeadLetter.objects.count() == 0
    assert took < 2  # not the 5 s the task would have run


def test_a_task_that_never_checks_runs_to_its_end():
    job, _took = _cancel_while_running(deaf.delay(30))
    assert job.status == Status.SUCCESSFUL
    assert job.result == "ran to its end"
    assert job.cancel_requested_at is not None


def test_a_failure_after_the_request_ends_cancelled_without_a_retry():
    job, _took = _cancel_while_running(fails_when_asked.delay())
    assert job.status == Status.CANCELLED
    assert job.error == "ValueError: cleanup went wrong"
    assert DeadLetter.objects.count() == 0


def test_an_async_task_is_cancelled():
    job, took = _cancel_while_running(asleep.delay())
    assert job.status == Status.CANCELLED
    assert job.error.startswith("django_debounce.exceptions.JobCancelled: ")
    assert RAN == ["cancelled"]
    assert took < 2


def test_a_waiting_job_is_cancelled_at_once_as_before():
    job = noted.apply_async(countdown=60)
    result = job.cancel()
    assert (result.cancelled, result.requested) == ([job.pk], [])
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.cancel_requested_at is None
    assert cancel_jobs([job.pk]).finished == {job.pk: "CANCELLED"}


def test_a_job_claimed_with_its_cancel_requested_never_runs():
    # A run that failed just as its cancel was asked went back to READY for its retry.
    job = noted.delay()
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    _worker().join(5)
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    assert RAN == []


def test_the_context_reads_the_mark_at_most_once_per_interval(settings):
    job = noted.delay()
    control = RunControl(job.pk, poll_interval=60)
    with CaptureQueriesContext(connection) as queries:
        assert not any(control.cancel_requested for _ in range(100))
    assert len(queries) == 1
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    assert control.read_cancel() is True
    with pytest.raises(JobCancelled):
        control.checkpoint()


def test_the_command_cancels_waiting_jobs_and_names_missing_ones():
    job = noted.apply_async(countdown=60)
    out = StringIO()
    call_command("debounce_cancel", str(job.pk), stdout=out)
    assert out.getvalue().startswith(f"cancelled 1 waiting job(s) [{job.pk}]")
    with pytest.raises(CommandError, match=r"no job with id\(s\) \[999999\]"):
        call_command("debounce_cancel", "999999", stdout=StringIO())
    with pytest.raises(CommandError, match="is not a job id"):
        call_command("debounce_cancel", "x", stdout=StringIO())


@debounced_task(name="tl.window_steps", debounce="1s", debounce_max_wait="1m", debounce_key="{0}")
def window_steps(key: str) -> str:
    context_free_steps()
    return key


def context_free_steps() -> None:
    STARTED.set()
    for _ in range(500):
        if RAN:  # set by the test once the cancel is asked: not a checkpoint
            return
        time.sleep(0.01)


def test_the_window_handle_asks_its_keys_running_job_to_stop():
    job = window_steps.delay("k")
    window_steps.window("k").flush()
    thread = _worker()
    assert STARTED.wait(5)
    assert window_steps.window("k").cancel_running().requested == [job.pk]
    RAN.append("release")
    thread.join(5)
    job.refresh_from_db()
    # The task never looked: it ran to its end, a success; the mark stays as the record.
    assert (job.status, job.result) == (Status.SUCCESSFUL, "k")
    assert job.cancel_requested_at is not None
    assert window_steps.window("k").cancel_running().requested == []
