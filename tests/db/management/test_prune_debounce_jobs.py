"""Retention (issue #11, item 3): ``prune_debounce_jobs`` and the worker's ``DEBOUNCE_PRUNE``."""

from __future__ import annotations

import datetime as dt
import io
import threading
from contextlib import contextmanager

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from django_debounce.conf import settings as debounce_settings
from django_debounce.conf.retention import parse_prune
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job, JobDependency
from django_debounce.ops.retention import prune_jobs
from django_debounce.ops.sweep import SweepSchedule
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db

Status = Job.Status
DAY = dt.timedelta(days=1)
FINISHED = [Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED, Status.EXPIRED, Status.SHED]


@contextmanager
def deletes():
    """Record (table, rows deleted) of every DELETE statement the block issues."""
    seen: list[tuple[str, int]] = []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("DELETE"):
            table = sql.split("WHERE")[0].replace('"', "").replace("`", "").split()[2]
            seen.append((table, context["cursor"].rowcount))
        return result

    with connection.execute_wrapper(wrapper):
        yield seen


def seed():
    """Old finished jobs of every final status, and what must survive a 7-day prune."""
    old = [
        JobFactory(status=status, finished_at=T - 8 * DAY - n * dt.timedelta(seconds=1))
        for n in range(3)
        for status in FINISHED
    ]
    keep = {
        "recent": JobFactory(status=Status.SUCCESSFUL, finished_at=T - 6 * DAY),
        "ready": JobFactory(created_at=T - 30 * DAY, run_at=T + DAY),
        "running": JobFactory(status=Status.RUNNING, created_at=T - 30 * DAY, worker_id="w"),
        "dependency": JobFactory(status=Status.SUCCESSFUL, finished_at=T - 9 * DAY),
    }
    JobDependency.objects.create(job=keep["ready"], dependency=keep["dependency"])
    # A finished job's dependency goes with it: nothing waits for it any more.
    done_dependent = JobFactory(status=Status.SUCCESSFUL, finished_at=T - 8 * DAY)
    gone_dependency = JobFactory(status=Status.SUCCESSFUL, finished_at=T - 9 * DAY)
    JobDependency.objects.create(job=done_dependent, dependency=gone_dependency)
    old += [done_dependent, gone_dependency]
    letter = DeadLetterFactory(
        job=old[1], task_name="tests.noop", args=[1, 2], created_at=T - 8 * DAY
    )
    return old, keep, letter


def test_prune_deletes_old_finished_jobs_and_keeps_the_rest(clock):
    old, keep, letter = seed()
    out = io.StringIO()
    with deletes() as seen:
        call_command("prune_debounce_jobs", older_than="7d", batch_size=4, stdout=out)
    assert Job.objects.filter(pk__in=[j.pk for j in old]).count() == 0
    assert set(Job.objects.values_list("pk", flat=True)) == {j.pk for j in keep.values()}
    assert list(JobDependency.objects.values_list("job", "dependency")) == [
        (keep["ready"].pk, keep["dependency"].pk)
    ]
    # The dead letter stays, without its job; its Retry still enqueues the stored call.
    letter.refresh_from_db()
    assert letter.job_id is None and DeadLetter.objects.count() == 1
    job = letter.retry()
    assert (job.task_name, job.args, job.status) == ("tests.noop", [1, 2], Status.READY)
    # 17 jobs in batches of 4: five transactions, no DELETE of jobs over 4 rows.
    job_deletes = [rows for table, rows in seen if table == Job._meta.db_table]
    assert sum(job_deletes) == 17 and max(job_deletes) <= 4
    assert max(rows for _, rows in seen) <= 4
    # One fact a line, each within 80 columns.
    assert out.getvalue().splitlines() == [
        f"deleted 17 job(s) that finished before {T - 7 * DAY:%Y-%m-%d %H:%M:%S %Z}",
        "in 5 batch(es) of at most 4 rows",
        "kept 1 finished job(s) that a READY or RUNNING job depends on",
    ]


def test_dry_run_counts_and_deletes_nothing(clock):
    seed()
    before = Job.objects.count()
    out = io.StringIO()
    call_command(
        "prune_debounce_jobs", older_than="7d", dry_run=True, dead_letters=True, stdout=out
    )
    assert Job.objects.count() == before
    assert out.getvalue().splitlines()[:2] == [
        f"would delete 17 job(s) that finished before {T - 7 * DAY:%Y-%m-%d %H:%M:%S %Z}",
        "would delete 1 dead letter(s) created before then",
    ]


def test_dead_letters_flag_prunes_old_letters_too(clock):
    old, keep, letter = seed()
    young = DeadLetterFactory(created_at=T - DAY, job__finished_at=T - DAY)
    result = prune_jobs(older_than=dt.timedelta(days=7), batch_size=2, dead_letters=True)
    assert (result.jobs, result.dead_letters, result.kept_dependencies) == (17, 1, 1)
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [young.pk]


def test_bad_arguments_are_refused_before_anything_is_deleted(clock):
    seed()
    before = Job.objects.count()
    with pytest.raises(CommandError, match="--older-than"):
        call_command("prune_debounce_jobs", older_than="7 days")
    with pytest.raises(CommandError, match="batch-size"):
        call_command("prune_debounce_jobs", older_than="7d", batch_size=0)
    with pytest.raises(ValueError, match="batch_size=0"):
        prune_jobs(older_than=DAY, batch_size=0)
    assert Job.objects.count() == before


def test_worker_prunes_per_setting(clock, burst, settings):
    old, keep, letter = seed()
    settings.DEBOUNCE_PRUNE = {"older_than": "7d", "every": "1h", "batch_size": 3}
    burst()
    assert not Job.objects.filter(pk__in=[j.pk for j in old]).exists()
    assert Job.objects.filter(pk__in=[j.pk for j in keep.values()]).count() == 4
    assert DeadLetter.objects.filter(pk=letter.pk).exists()


def test_prune_setting_parses_and_is_checked(settings):
    assert parse_prune(None) is None
    parsed = parse_prune({"older_than": "2d"})
    assert (parsed.older_than, parsed.every, parsed.batch_size, parsed.dead_letters) == (
        2 * DAY,
        dt.timedelta(hours=1),
        1000,
        False,
    )
    for bad, words in (
        ("7d", "must be None"),
        ({"older": "7d"}, "unknown key"),
        ({"batch_size": 0}, "batch_size"),
        ({"dead_letters": "yes"}, "dead_letters"),
        ({"every": "soon"}, "every"),
    ):
        with pytest.raises(ConfigurationError, match=words):
            parse_prune(bad)
        settings.DEBOUNCE_PRUNE = bad
        errors = [m for m in run_checks() if m.id == "django_debounce.E045"]
        assert len(errors) == 1 and words.split()[0] in errors[0].msg
    settings.DEBOUNCE_PRUNE = {"older_than": "30d"}
    assert [m for m in run_checks() if m.id == "django_debounce.E045"] == []
    assert debounce_settings.prune.older_than == 30 * DAY


def test_admin_shows_and_retries_a_dead_letter_whose_job_was_pruned(clock, admin_client):
    old, keep, letter = seed()
    prune_jobs(older_than=dt.timedelta(days=7))
    page = admin_client.get(reverse("admin:django_debounce_deadletter_change", args=[letter.pk]))
    assert page.status_code == 200
    listing = admin_client.get(reverse("admin:django_debounce_deadletter_changelist"))
    assert listing.status_code == 200 and f">{letter.pk}<".encode() in listing.content
    response = admin_client.post(
        reverse("admin:django_debounce_deadletter_changelist"),
        {"action": "retry_selected", "_selected_action": [letter.pk]},
    )
    assert response.status_code == 302
    letter.refresh_from_db()
    assert letter.job_id is None
    assert (letter.retry_job.task_name, letter.retry_job.args) == ("tests.noop", [1, 2])


def test_schedule_prunes_at_start_then_once_per_every_and_stops_on_shutdown(clock, settings):
    settings.DEBOUNCE_PRUNE = {"older_than": "7d", "every": "1h", "batch_size": 2}
    schedule = SweepSchedule()
    renewals: list[int] = []
    stopping = threading.Event()

    def run() -> None:
        schedule.run_if_due(
            using="default",
            lease=dt.timedelta(seconds=60),
            stopping=stopping,
            renew=lambda: renewals.append(1),
        )

    seed()
    stopping.set()  # shutting down: one batch, then stop
    run()
    assert (schedule.last_prune.jobs, schedule.last_prune.stopped) == (2, True)
    stopping.clear()
    clock(minutes=59)
    run()  # not due yet: nothing more deleted
    assert schedule.last_prune.jobs == 2 and Job.objects.count() == 21 - 2
    clock(minutes=60)
    run()
    assert (schedule.last_prune.jobs, schedule.last_prune.stopped) == (15, False)
    assert schedule.next_prune_at == T + dt.timedelta(hours=2)


def test_progress_lines_on_stderr(clock):
    seed()
    err = io.StringIO()
    call_command(
        "prune_debounce_jobs", older_than="7d", batch_size=10, stdout=io.StringIO(), stderr=err
    )
    assert err.getvalue().split("\n") == [
        "pruned 10 of 17 jobs (59%)",
        "pruned 17 of 17 jobs (100%)",
        "",
    ]


@pytest.mark.parametrize(
    "typed, message",
    [
        ("7", "argument --older-than: '7' needs a unit: 7d, 7h, 7m or 7s"),
        ("0", "argument --older-than: '0' needs a unit: 0d, 0h, 0m or 0s"),
        ("0s", "argument --older-than: '0s' must be longer than zero (e.g. 7d)"),
        ("7 days", "argument --older-than: '7 days' is not a duration (7d, 12h, 30m)"),
        ("99999d", "argument --older-than: '99999d' is over 100 years (36500d)"),
    ],
)
def test_older_than_messages_echo_what_was_typed(clock, typed, message):
    """Decision 134: a unit is required on the command line; no word of "timedelta"."""
    seed()
    before = Job.objects.count()
    with pytest.raises(CommandError) as caught:
        call_command("prune_debounce_jobs", older_than=typed)
    assert str(caught.value) == message
    assert len("CommandError: " + message) <= 80
    assert Job.objects.count() == before


def test_python_callers_may_still_give_seconds_or_a_timedelta(clock):
    seed()
    out = io.StringIO()
    call_command("prune_debounce_jobs", older_than=7 * 86400, dry_run=True, stdout=out)
    assert out.getvalue().startswith("would delete 17 job(s)")
    call_command("prune_debounce_jobs", older_than=7 * DAY, dry_run=True, stdout=out)


def test_ctrl_c_reports_what_was_deleted_and_exits_130(clock, monkeypatch):
    """Ctrl-C in the third batch: two batches stay deleted, the third rolls back (decision 134)."""
    from django_debounce.ops import retention

    seed()
    real = retention._delete_batch
    calls = []

    def batch(rows, batch_size):
        calls.append(batch_size)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what Python raises on SIGINT, here between two batches
        return real(rows, batch_size)

    monkeypatch.setattr(retention, "_delete_batch", batch)
    before = Job.objects.count()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("prune_debounce_jobs", older_than="7d", batch_size=4, stdout=out, stderr=err)
    assert caught.value.returncode == 130
    assert str(caught.value) == "interrupted (Ctrl-C): the rest stays for the next prune"
    assert Job.objects.count() == before - 8
    assert out.getvalue().splitlines() == [
        f"deleted 8 job(s) that finished before {T - 7 * DAY:%Y-%m-%d %H:%M:%S %Z}",
        "in 2 batch(es) of at most 4 rows",
    ]


@pytest.mark.postgres
@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_rows_another_prune_holds_are_skipped_and_the_summary_says_so():
    """Two prunes at once (decision 134): rows locked by the other are left to it."""
    from django.db import connections, transaction

    if connection.vendor != "postgresql":
        pytest.skip("FOR UPDATE SKIP LOCKED: PostgreSQL run only")
    old = T - 8 * DAY
    jobs = JobFactory.create_batch(6, status=Status.SUCCESSFUL, finished_at=old)
    held = [j.pk for j in jobs[:2]]
    locked, release = threading.Event(), threading.Event()

    def other_prune() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk__in=held))
                locked.set()
                release.wait(30)
                Job.objects.filter(pk__in=held).delete()
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_prune)
    thread.start()
    try:
        assert locked.wait(30)
        out = io.StringIO()
        call_command("prune_debounce_jobs", older_than="7d", stdout=out, no_progress=True)
    finally:
        release.set()
        thread.join(30)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("deleted 4 job(s) that finished before ")
    assert lines[2] == "2 of the 6 job(s) counted at the start went to another prune"
    assert max(len(line) for line in lines) <= 80
    assert Job.objects.count() == 0
