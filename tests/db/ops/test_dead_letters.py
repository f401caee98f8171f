"""Dead letters: what they keep, retry(), unknown tasks, planned outcomes, signals (§8, §9, §11)."""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest

from django_debounce import codec
from django_debounce.models import DeadLetter, Job
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory
from tests.testapp.models import CallLog, Order
from tests.testapp.tasks_worker import (
    RECEIVED,
    bill,
    bill_atomic,
    bill_replace,
    flaky,
    record_tag,
)

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")
BILL_TASKS = {"plain": bill, "replace": bill_replace, "atomic": bill_atomic}


def call(n: int) -> dict[str, Any]:
    """Keyword arguments of call p<n>, with B13's types."""
    return {
        "amount": Decimal(f"{n}234567890.123456789"),
        "when": dt.datetime(2024, 2, 29, 10, 0, n, tzinfo=BERLIN),
        "ref": UUID(int=n),
        "day": dt.date(2024, 2, 29),
        "at": dt.time(23, 59, 59, 999999),
        "span": dt.timedelta(days=1, microseconds=n),
        "pair": (n, "a"),
        "meta": {"price": Decimal("0.10"), "ids": [UUID(int=100 + n)]},
    }


def assert_same_call(received: dict[str, Any], n: int) -> None:
    """``received`` equals p<n> as a task gets it back: same values and types (tuples as lists)."""
    sent = call(n)
    assert set(received) == set(sent)
    assert isinstance(received["amount"], Decimal)
    assert str(received["amount"]) == str(sent["amount"])
    assert received["when"] == sent["when"]
    assert received["when"].utcoffset() == sent["when"].utcoffset() == dt.timedelta(hours=1)
    assert isinstance(received["ref"], UUID) and received["ref"] == sent["ref"]
    assert type(received["day"]) is dt.date and received["day"] == sent["day"]
    assert received["at"] == sent["at"]
    assert received["span"] == sent["span"]
    assert received["pair"] == [n, "a"]
    assert str(received["meta"]["price"]) == "0.10"
    assert received["meta"]["ids"] == [UUID(int=100 + n)]
    assert isinstance(received["meta"]["ids"][0], UUID)


@pytest.fixture
def received():
    RECEIVED.clear()
    yield RECEIVED
    RECEIVED.clear()


def fail_one_window(clock, burst, task) -> tuple[Job, DeadLetter]:
    """p1, p2, p3 at T, T+10s, T+20s form one job; run@T+1m20s fails it for good."""
    first = task.apply_async(args=("acct-1",), kwargs=call(1), priority=5, metadata={"invoice": 9})
    clock(seconds=10)
    second = task.delay("acct-1", **call(2))
    clock(seconds=20)
    third = task.delay("acct-1", **call(3))
    assert [first.outcome, second.outcome, third.outcome] == ["created", "debounced", "debounced"]
    assert first.pk == second.pk == third.pk
    assert third.run_at == T + dt.timedelta(minutes=1, seconds=20)
    clock(minutes=1, seconds=19)
    burst()
    assert Job.objects.get().status == Job.Status.READY
    clock(minutes=1, seconds=20)
    burst()
    job = Job.objects.get()
    return job, DeadLetter.objects.get()


@pytest.mark.parametrize("variant", ["plain", "replace", "atomic"])
def test_b43_dead_letter_keeps_arguments(clock, burst, received, variant):
    task = BILL_TASKS[variant]
    job, letter = fail_one_window(clock, burst, task)
    stored = 3 if variant == "replace" else 1

    assert (job.status, job.attempts, job.finished_at) == (
        Job.Status.FAILED,
        1,
        T + dt.timedelta(minutes=1, seconds=20),
    )
    assert job.enqueue_count == 3
    assert letter.job == job
    assert letter.job.debounce_key == "bill:acct-1"
    assert letter.task_name == task.name
    assert letter.queue == "default"
    assert letter.args == ["acct-1"]
    assert letter.kwargs == codec.encode_call((), call(stored))[1]
    args, kwargs = codec.decode_call(letter.args, letter.kwargs)
    assert args == ["acct-1"]
    assert_same_call(kwargs, stored)
    message = "could not bill acct-1" if variant == "atomic" else "card declined for acct-1"
    assert letter.error == f"tests.testapp.tasks_worker.FlakyError: {message}"
    assert letter.traceback.startswith("Traceback (most recent call last):")
    assert "FlakyError" in letter.traceback
    assert letter.reason.startswith("failed: 1 attempt(s)")
    assert len(received) == 1
    assert_same_call(received[0][2], stored)
    if variant == "atomic":  # the body's own atomic() rolled back before it raised
        assert "IntegrityError" in letter.traceback
        assert Order.objects.count() == 0
        assert CallLog.objects.count() == 0

    # At T+30m, with no window open, retry() goes through the normal enqueue path.
    clock(minutes=30)
    assert not Job.objects.open_windows().exists()
    retried = letter.retry()
    assert retried is not None
    assert retried.outcome == "created"
    assert retried.pk != job.pk
    assert retried.status == Job.Status.READY
    assert retried.is_open_window
    assert retried.run_at == T + dt.timedelta(minutes=31)
    assert retried.opened_at == T + dt.timedelta(minutes=30)
    assert (retried.task_name, retried.debounce_key) == (task.name, "bill:acct-1")
    assert (retried.args, retried.kwargs) == (letter.args, letter.kwargs)
    assert (retried.priority, retried.metadata, retried.expires_at) == (5, {"invoice": 9}, None)
    letter.refresh_from_db()
    assert letter.retried_at == T + dt.timedelta(minutes=30)
    assert letter.retry_job_id == retried.pk
    assert Job.objects.count() == 2

    # A second retry does nothing; a forced one joins the READY job and adds no row.
    assert letter.retry() is None
    assert Job.objects.count() == 2
    forced = letter.retry(force=True)
    assert forced is not None
    assert (forced.pk, forced.outcome) == (retried.pk, "debounced")
    assert forced.run_at == T + dt.timedelta(minutes=31)
    assert Job.objects.count() == 2
    assert Job.objects.get(pk=retried.pk).enqueue_count == 2

    # run@T+31m receives values equal to the stored call (Decimal and UUID types included).
    received.clear()
    clock(minutes=31)
    burst()
    assert len(received) == 1
    assert received[0][1] == ("acct-1",)
    assert_same_call(received[0][2], stored)
    newest = DeadLetter.objects.first()
    assert newest is not None and newest.job_id == retried.pk
    assert DeadLetter.objects.count() == 2


@pytest.mark.parametrize("variant", ["plain", "replace"])
def test_b43_retry_joins_an_open_window(clock, burst, received, variant):
    task = BILL_TASKS[variant]
    failed, letter = fail_one_window(clock, burst, task)
    stored = 3 if variant == "replace" else 1

    clock(minutes=29, seconds=50)
    window = task.delay("acct-1", **call(4))
    assert window.outcome == "created"
    assert window.run_at == T + dt.timedelta(minutes=30, seconds=50)

    clock(minutes=30)
    joined = letter.retry()
    assert joined is not None
    assert (joined.pk, joined.outcome) == (window.pk, "debounced")
    assert joined.run_at == T + dt.timedelta(minutes=31)
    assert joined.max_run_at == T + dt.timedelta(minutes=39, seconds=50)
    assert Job.objects.count() == 2
    assert Job.objects.open_windows().get().pk == window.pk
    letter.refresh_from_db()
    assert letter.retry_job_id == window.pk
    assert letter.retried_at == T + dt.timedelta(minutes=30)

    # The payload stays p4; with replace it becomes the retried arguments.
    expected = stored if variant == "replace" else 4
    row = Job.objects.get(pk=window.pk)
    assert row.kwargs == codec.encode_call((), call(expected))[1]
    assert row.enqueue_count == 2
    received.clear()
    clock(minutes=31)
    burst()
    assert len(received) == 1
    assert_same_call(received[0][2], expected)


# -- unknown tasks ---------------------------------------------------------------------


def test_unknown_task_is_dead_lettered_and_never_imported(clock, burst, tmp_path, signal_log):
    marker = tmp_path / "pwned"
    assert "this" not in sys.modules
    # Enqueued longer ago than DEBOUNCE_UNKNOWN_TASK_GRACE (10 min): no deploy is under way.
    old = T - dt.timedelta(minutes=11)
    shell = JobFactory(task_name="os.system", args=[f"touch {marker}"], created_at=old)
    zen = JobFactory(task_name="this.main", run_at=T - dt.timedelta(seconds=1), created_at=old)

    burst()

    assert not marker.exists()
    assert "this" not in sys.modules
    for job in (shell, zen):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at) == (Job.Status.FAILED, 1, T)
        letter = DeadLetter.objects.get(job=job)
        assert letter.reason == f"unknown_task: {job.task_name}"
        assert letter.task_name == job.task_name
        assert letter.args == job.args
        assert letter.error.startswith(
            f"django_debounce.exceptions.UnknownTaskError: no task named {job.task_name!r}"
        )
    assert DeadLetter.objects.count() == 2
    names = [name for name, _, _ in signal_log]
    assert "job_started" not in names
    assert names.count("job_dead_lettered") == 2


def test_an_unknown_task_is_put_back_during_its_grace_then_dead_lettered(clock, burst, caplog):
    """Decision 154: a worker older than the task's code leaves its young jobs to others."""
    job = JobFactory(task_name="deploy.new_task", run_at=T)
    with caplog.at_level("WARNING", logger="django_debounce.worker"):
        burst()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.worker_id, row.started_at) == ("READY", 0, "", None)
    assert row.run_at == T + dt.timedelta(seconds=5), "offered again 5 s later"
    assert not DeadLetter.objects.exists()
    assert caplog.records[0].getMessage() == (
        f"job {job.pk} names task 'deploy.new_task', which this process does not know; put "
        "back, not dead-lettered, until 2026-03-01 12:10:00 UTC (DEBOUNCE_UNKNOWN_TASK_GRACE "
        "after its last enqueue): a process that knows it (the other executor, or a worker "
        "running newer code) takes it meanwhile"
    )
    clock(minutes=10)
    burst()
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Job.Status.FAILED, 1)
    assert DeadLetter.objects.get(job=job).error == (
        "django_debounce.exceptions.UnknownTaskError: no task named 'deploy.new_task' is "
        "registered in this worker; the worker never imports a path taken from the database. "
        "Either the module that declares it is not imported by this worker (its app must be in "
        "INSTALLED_APPS and the task in the app's tasks.py, which is autodiscovered, or in a "
        "module that tasks.py imports), or the worker started before the code that declares it "
        "was deployed (restart it). Then run `manage.py retry_dead_letters --reason-prefix "
        "unknown_task:`"
    )


def test_an_unknown_task_grace_of_zero_dead_letters_at_once(clock, burst, settings):
    settings.DEBOUNCE_UNKNOWN_TASK_GRACE = 0
    job = JobFactory(task_name="deploy.gone", run_at=T)
    burst()
    assert DeadLetter.objects.get(job=job).reason == "unknown_task: deploy.gone"


# -- ordering, planned outcomes ------------------------------------------------------------


def test_dead_letters_are_listed_newest_first(clock):
    older = DeadLetterFactory(created_at=T - dt.timedelta(minutes=2))
    newest_a = DeadLetterFactory(created_at=T)
    middle = DeadLetterFactory(created_at=T - dt.timedelta(minutes=1))
    newest_b = DeadLetterFactory(created_at=T)  # same instant, later row
    assert list(DeadLetter.objects.all()) == [newest_b, newest_a, middle, older]
    assert DeadLetter.objects.first() == newest_b


def test_expired_job_never_runs_and_gets_no_dead_letter(clock, burst, signal_log):
    stale = record_tag.apply_async(args=("stale",), expires="5m")
    fresh = record_tag.apply_async(args=("fresh",), countdown="4m", expires="10m")
    assert stale.expires_at == T + dt.timedelta(minutes=5)

    clock(minutes=6)
    burst()

    stale.refresh_from_db()
    assert (stale.status, stale.attempts, stale.finished_at) == (
        Job.Status.EXPIRED,
        0,
        T + dt.timedelta(minutes=6),
    )
    assert Job.objects.get(pk=fresh.pk).status == Job.Status.SUCCESSFUL
    assert list(CallLog.objects.values_list("key", flat=True)) == ["fresh"]
    assert DeadLetter.objects.count() == 0
    assert "job_dead_lettered" not in [name for name, _, _ in signal_log]


def test_cancelled_job_is_left_alone_without_dead_letter(clock, burst):
    cancelled = JobFactory(
        task_name="wrk.tag",
        args=["cancelled"],
        status=Job.Status.CANCELLED,
        run_at=T - dt.timedelta(minutes=1),
        finished_at=T - dt.timedelta(seconds=30),
    )
    burst()
    cancelled.refresh_from_db()
    assert (cancelled.status, cancelled.attempts) == (Job.Status.CANCELLED, 0)
    assert CallLog.objects.count() == 0
    assert DeadLetter.objects.count() == 0


# -- signals ---------------------------------------------------------------------------------


def test_signals_of_a_failure_retry_and_dead_letter(clock, burst, signal_log):
    job = bill.delay("acct-9", note="a")
    again = bill.delay("acct-9", note="b")
    assert [(n, kw["outcome"], kw["job"].pk) for n, kw, _ in signal_log] == [
        ("job_enqueued", "created", job.pk),
        ("job_enqueued", "debounced", job.pk),
    ]
    assert again.pk == job.pk
    signal_log.clear()

    clock(minutes=1)
    burst()

    assert [(name, status) for name, _, status in signal_log] == [
        ("job_started", Job.Status.RUNNING),
        ("job_finished", Job.Status.FAILED),
        ("job_dead_lettered", Job.Status.FAILED),
    ]
    finished, dead = signal_log[1][1], signal_log[2][1]
    assert finished["status"] == Job.Status.FAILED
    assert set(dead) == {"sender", "job", "dead_letter"}
    assert dead["sender"] is Job
    assert dead["job"].pk == job.pk
    letter = DeadLetter.objects.get()
    assert dead["dead_letter"].pk == letter.pk
    assert dead["dead_letter"].reason == letter.reason


def test_finished_signal_reports_a_scheduled_retry_as_ready(clock, burst, signal_log):
    job = flaky.delay(1)  # always raises; max_retries=3
    burst()
    names = [(name, status) for name, _, status in signal_log]
    assert names == [
        ("job_enqueued", Job.Status.READY),
        ("job_started", Job.Status.RUNNING),
        ("job_finished", Job.Status.READY),
    ]
    assert signal_log[-1][1]["status"] == Job.Status.READY
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.READY, 1)
    assert job.error == "tests.testapp.tasks_worker.FlakyError: downstream unavailable"
    assert DeadLetter.objects.count() == 0
