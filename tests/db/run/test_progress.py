"""Progress of a running job (issue #22 item 4, decisions 202-204): rate bound, last value, fence.

The tasks move the package's clock themselves (the ``clock`` fixture, handed to
them through :data:`MOVE`) between ``set_progress`` calls, and read the job's row
after each call, so each test asserts the exact value stored after every call
and the exact number of progress ``UPDATE`` statements issued.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import signals, task
from django_debounce.context import JobContext
from django_debounce.exceptions import ProgressError
from django_debounce.models import Job
from django_debounce.progress import Progress, progress_of
from tests.conftest import T

pytestmark = pytest.mark.django_db

Status = Job.Status
#: The clock's ``move`` while a test runs (the tasks step time with it).
MOVE: list[Callable[..., dt.datetime]] = []
#: ``(done, total, note)`` stored on the row after each call, as the task read it back.
STORED: list[tuple[int | None, int | None, str]] = []


@pytest.fixture(autouse=True)
def _moves(clock):
    MOVE[:] = [clock]
    STORED.clear()
    yield
    MOVE.clear()


def _stored(job_id: int) -> tuple[int | None, int | None, str]:
    row = Job.objects.values_list("progress_done", "progress_total", "progress_note").get(pk=job_id)
    return row


@task(name="pg.steps", takes_context=True, max_retries=0)
def steps(context: JobContext, plan: list[list[float]], fail: bool = False) -> str:
    """At each ``[seconds after T, done]`` of ``plan``: move there, report ``done`` of 10."""
    assert context.job is not None
    for at, done in plan:
        MOVE[0](seconds=at)
        context.set_progress(int(done), 10, f"step {int(done)}")
        STORED.append(_stored(context.job.pk))
    if fail:
        raise RuntimeError("broke after its progress")
    return "done"


@task(name="pg.async_steps", takes_context=True, max_retries=0)
async def async_steps(context: JobContext) -> str:
    for done in (1, 2):
        await context.aset_progress(done, 2, "async")
    try:
        context.set_progress(3, 3)
    except ProgressError as exc:
        return str(exc)
    return "no error"


@task(name="pg.lost_lease", takes_context=True, max_retries=0)
def lost_lease(context: JobContext) -> None:
    """Report, then lose the job to a newer run (another worker's claim), then report again."""
    assert context.job is not None
    context.set_progress(1, 4, "mine")
    Job.objects.filter(pk=context.job.pk).update(
        worker_id="newer-worker", attempts=2, progress_done=3, progress_note="newer run's"
    )
    MOVE[0](seconds=5)
    context.set_progress(2, 4, "stale")  # fenced: written nowhere
    STORED.append(_stored(context.job.pk))
    context.set_progress(4, 4, "stale too")  # held back, then the flush: fenced as well


def _progress_updates(queries: CaptureQueriesContext) -> int:
    return sum(
        1
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE") and "progress_done" in q["sql"]
    )


def test_ten_calls_in_one_second_write_once_then_the_last_value_when_the_job_ends(burst):
    job = steps.delay([[i / 10, i + 1] for i in range(10)])  # T+0.0 .. T+0.9: done 1..10
    with CaptureQueriesContext(connection) as queries:
        burst()
    # The first call is written at once; the nine after it, within the second, are held.
    assert STORED == [(1, 10, "step 1")] * 10
    assert _progress_updates(queries) == 2  # that first write, and the flush at the end
    job.refresh_from_db()
    assert job.status == Status.SUCCESSFUL
    assert (job.progress_done, job.progress_total, job.progress_note) == (10, 10, "step 10")
    assert job.progress_at == T + dt.timedelta(seconds=0.9)
    assert progress_of(job) == Progress(10, 10, "step 10")


def test_calls_over_two_and_a_half_seconds_write_once_a_second_and_at_the_end(burst):
    plan = [[i / 4, i] for i in range(11)]  # T+0, 0.25, ..., 2.5: done 0..10
    job = steps.delay(plan)
    with CaptureQueriesContext(connection) as queries:
        burst()
    # Written at T+0 (done 0), T+1.0 (done 4), T+2.0 (done 8); done 10 at T+2.5 at the end.
    assert [s[0] for s in STORED] == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8]
    assert _progress_updates(queries) == 4
    job.refresh_from_db()
    assert (job.progress_done, job.progress_at) == (10, T + dt.timedelta(seconds=2.5))


def test_a_failed_run_keeps_its_last_value_and_a_retry_shows_none_until_it_reports(burst, clock):
    job = steps.delay([[0, 1], [0.5, 6]], fail=True)
    burst()
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert (job.progress_done, job.progress_note) == (6, "step 6")  # the held value, flushed
    assert progress_of(job) == Progress(6, 10, "step 6")
    # A later claim of the job (a retry) starts a run the stored value does not belong to.
    job.started_at = T + dt.timedelta(minutes=1)
    assert progress_of(job) is None


def test_a_run_that_lost_its_lease_writes_nothing_over_the_newer_run(burst):
    job = lost_lease.delay()
    burst()
    assert STORED == [(3, 4, "newer run's")]
    row = Job.objects.get(pk=job.pk)
    assert (row.worker_id, row.attempts) == ("newer-worker", 2)
    assert (row.progress_done, row.progress_total, row.progress_note) == (3, 4, "newer run's")
    assert row.progress_at == T  # the first (own) write's instant; the newer run's update kept it


def test_an_async_task_reports_through_aset_progress_and_is_told_about_set_progress(burst):
    job = async_steps.delay()
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCESSFUL
    assert "await context.aset_progress" in job.result
    assert (job.progress_done, job.progress_total, job.progress_note) == (2, 2, "async")


def test_each_write_sends_job_progress_once(burst):
    seen: list[tuple[int, Progress]] = []

    def receiver(sender: Any, job: Job, progress: Progress, **kwargs: Any) -> None:
        seen.append((job.pk, progress))

    signals.job_progress.connect(receiver, weak=False)
    try:
        job = steps.delay([[0, 1], [0.5, 2], [1.5, 3], [1.6, 4]])
        burst()
    finally:
        signals.job_progress.disconnect(receiver)
    assert seen == [
        (job.pk, Progress(1, 10, "step 1")),
        (job.pk, Progress(3, 10, "step 3")),
        (job.pk, Progress(4, 10, "step 4")),
    ]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((-1,), "done must be an int from 0 to 9223372036854775807, got -1"),
        (
            (True,),
            "done must be an int from 0 to 9223372036854775807, got True (a bool is not a count)",
        ),
        (("3",), "done must be an int from 0 to 9223372036854775807, got '3'"),
        ((1.5,), "done must be an int from 0 to 9223372036854775807, got 1.5"),
        ((2**63,), "done must be an int from 0 to 9223372036854775807, got 9223372036854775808"),
        ((1, -2), "total must be an int from 0 to 9223372036854775807 or None (unknown), got -2"),
        ((5, 4), "done (5) exceeds total (4)"),
        ((1, 2, 3), "note must be a str"),
        ((1, 2, "x" * 201), "note is 201 characters, at most 200"),
    ],
)
def test_bad_progress_is_refused_before_any_write(args, named):
    context = JobContext.inline()
    with pytest.raises(ProgressError, match=re.escape(named)):
        context.set_progress(*args)
    context.set_progress(3, 3, "x" * 200)  # the bounds themselves are accepted
    context.set_progress(2**63 - 1, 2**63 - 1)
    context.set_progress(0, 0)
    context.set_progress(7)


@task(name="pg.silent", takes_context=True, max_retries=0)
def silent(context: JobContext) -> None:
    """Report twice at one instant (the second is held), then renew the lease twice."""
    from django_debounce.run.leases import renew_leases

    job = context.job
    assert job is not None
    context.set_progress(1, 2, "first")
    context.set_progress(2, 2, "held")
    for seconds in (0.5, 1.0):  # a renewal within the second holds on; one after writes
        MOVE[0](seconds=seconds)
        renew_leases(
            [job.pk], worker_id=job.worker_id, lease=dt.timedelta(minutes=1), using="default"
        )
        STORED.append(_stored(job.pk))


def test_a_value_held_while_the_task_is_silent_is_written_by_the_next_lease_renewal(burst):
    job = silent.delay()
    with CaptureQueriesContext(connection) as queries:
        burst()
    assert STORED == [(1, 2, "first"), (2, 2, "held")]
    assert _progress_updates(queries) == 2  # the first write and the renewal's: nothing at the end
    job.refresh_from_db()
    assert (job.progress_done, job.progress_at) == (2, T + dt.timedelta(seconds=1))


@task(name="pg.huge", takes_context=True, max_retries=0)
def huge(context: JobContext) -> None:
    context.set_progress(2**63 - 2, 2**63 - 1, "é" * 200)


def test_the_largest_counts_and_the_longest_note_are_stored_as_given(burst):
    job = huge.delay()
    burst()
    assert _stored(job.pk) == (2**63 - 2, 2**63 - 1, "é" * 200)
    assert Job.objects.get(pk=job.pk).status == Status.SUCCESSFUL
