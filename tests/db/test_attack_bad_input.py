"""Bad input to the new public APIs (attack branch): each must raise the package's own
exception with a clear message and write nothing, never a raw database or encoding error.

Every test here is a defect found by the attack, marked ``xfail(strict=True)``: it fails
today and passes once the defect is fixed.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from django_debounce import debounced_task, task
from django_debounce.context import JobContext
from django_debounce.exceptions import DebounceError, ProgressError
from django_debounce.models import Job
from django_debounce.ops.periodic import PeriodicScheduler

pytestmark = pytest.mark.django_db(transaction=True)

#: What each run of ``atk.note`` saw: the exception type name its set_progress raised, or "ok".
SEEN: list[str] = []
NOTES = {"surrogate": "half a pair \ud800", "nul": "a\x00b"}


@task(name="atk.note", takes_context=True, max_retries=0)
def note_task(context: JobContext, which: str) -> str:
    # The first call of a run is written at once; the second, within the second, is held
    # back and written by the flush when the run ends.
    context.set_progress(1, 3, "fine")
    try:
        context.set_progress(2, 3, NOTES[which])
        SEEN.append("ok")
    except ProgressError:
        SEEN.append("ProgressError")
    return "returned"


@debounced_task(name="atk.win", debounce="1m", debounce_max_wait="5m", debounce_key="k:{0}")
def win(x: int) -> int:
    return x


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()
    yield
    SEEN.clear()


@pytest.mark.xfail(
    strict=True,
    reason="validate_progress (progress.py:117) does not refuse a note no database can store "
    "(a lone surrogate); the held value's write raises UnicodeEncodeError, not DatabaseError, "
    "out of ProgressReporter.flush (progress.py:209, called at run/execution.py:159) and the "
    "worker crashes with the run's outcome unrecorded",
)
def test_a_progress_note_with_a_lone_surrogate_is_a_progress_error_and_the_job_succeeds():
    job = note_task.delay("surrogate")
    call_command("run_debounce_worker", burst=True)  # today: UnicodeEncodeError escapes
    assert SEEN == ["ProgressError"]
    row = Job.objects.get(pk=job.pk)
    assert row.status == Job.Status.SUCCESSFUL
    assert (row.progress_done, row.progress_note) == (1, "fine")


@pytest.mark.xfail(
    strict=True,
    reason="validate_progress (progress.py:117) accepts a NUL in the note (the codec and keys "
    "refuse it everywhere else); on PostgreSQL the write fails with DataError, which is only "
    "logged, so the task is never told its report was dropped",
)
def test_a_progress_note_with_a_nul_is_a_progress_error():
    job = note_task.delay("nul")
    call_command("run_debounce_worker", burst=True)
    assert SEEN == ["ProgressError"]
    row = Job.objects.get(pk=job.pk)
    assert row.status == Job.Status.SUCCESSFUL
    assert (row.progress_done, row.progress_note) == (1, "fine")


@pytest.mark.xfail(
    strict=True,
    reason="conf/schedules.py:83 checks a schedule name's length only, not that a database "
    "can store it: a NUL or a lone surrogate passes E047 and E048; then on PostgreSQL a NUL "
    "makes the tick's insert raise a raw DataError out of PeriodicScheduler.defer_due, and a "
    "surrogate fails every tick ('error')",
)
@pytest.mark.parametrize("name", ["nightly\x00report", "nightly\ud800report"])
def test_a_settings_schedule_name_with_a_nul_is_refused_by_the_checks(name):
    value = {name: {"task": "atk.win", "cron": "* * * * *", "args": [1]}}
    with override_settings(DEBOUNCE_SCHEDULES=value):
        ids = [m.id for m in checks.run_checks() if (m.id or "").startswith("django_debounce.E04")]
        assert ids, "no check refused a schedule name no database can store"
        PeriodicScheduler().defer_due()  # and deferring never raises a database error
    assert not Job.objects.exists()


@pytest.mark.xfail(
    strict=True,
    reason="Window.flush/cancel (ops/window_handles.py:119,136) pass now= to the UPDATE "
    "unchecked: a str raises Django's ValidationError, an int TypeError, a naive datetime "
    "or a date only a RuntimeWarning (and is written)",
)
@pytest.mark.parametrize("now", ["tomorrow", 5, dt.datetime(2020, 1, 1), dt.date(2020, 1, 1)])
@pytest.mark.parametrize("action", ["flush", "cancel"])
def test_a_window_action_refuses_a_now_that_is_not_an_aware_datetime(action, now):
    job = win.delay(1)
    before = Job.objects.values().get(pk=job.pk)
    with pytest.raises(DebounceError, match="now"):
        getattr(win.window(1), action)(now=now)
    assert Job.objects.values().get(pk=job.pk) == before  # nothing written


@pytest.mark.xfail(
    strict=True,
    reason="windows_of_keys (ops/window_handles.py) iterates a str as its characters: "
    "windows_for('k:1') is the windows of 'k', ':' and '1', where windows('ab') is refused",
)
def test_windows_for_a_single_str_is_refused():
    with pytest.raises(DebounceError):
        win.windows_for("k:1")


@pytest.mark.xfail(
    strict=True,
    reason="set_progress accepts any str as the note (progress.py:117) and debounce_status "
    "prints it raw (ops/running_progress.py:57): a newline breaks the one-line-per-job "
    "layout and an escape sequence reaches the operator's terminal",
)
def test_a_progress_note_with_control_characters_stays_on_its_status_line(clock):
    import io

    from tests.conftest import T
    from tests.factories import JobFactory

    job = JobFactory(
        status=Job.Status.RUNNING,
        worker_id="w1",
        attempts=1,
        started_at=T - dt.timedelta(seconds=5),
        lease_expires_at=T + dt.timedelta(seconds=60),
        task_name="reports.build",
        progress_done=1,
        progress_total=2,
        progress_note="page 1\nfake line\x1b[2J\r",
        progress_at=T,
    )
    out = io.StringIO()
    call_command("debounce_status", stdout=out)
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\r" not in text
    lines = text.splitlines()
    at = lines.index("running jobs with progress")
    assert lines[at + 1].split()[0] == f"#{job.pk}"
    assert "fake line" not in lines[at + 2]  # the note did not start a line of its own


@pytest.mark.xfail(
    strict=True,
    reason="Window(using=...) (ops/window_handles.py:94) checks the task name and the key "
    "but not the alias: an unknown one raises Django's ConnectionDoesNotExist at the first "
    "operation, not a package error at the handle",
)
def test_a_window_on_an_unknown_database_is_a_package_error():
    from django_debounce.ops.window_handles import Window

    with pytest.raises(DebounceError, match="nope"):
        Window("atk.win", "k:1", using="nope").inspect()
