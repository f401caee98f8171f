"""Bad input to the new public APIs: each raises the package's own exception with a clear
message and writes nothing, never a raw database or encoding error (decision 210).

Every test here pinned a defect an adversarial run with every feature on found
(``tests/processes/test_every_feature_at_once.py``), fixed since.
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

#: What each run of ``badin.note`` saw: the exception type name its set_progress raised, or "ok".
SEEN: list[str] = []
NOTES = {"surrogate": "half a pair \ud800", "nul": "a\x00b"}


@task(name="badin.note", takes_context=True, max_retries=0)
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


@debounced_task(name="badin.win", debounce="1m", debounce_max_wait="5m", debounce_key="k:{0}")
def win(x: int) -> int:
    return x


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()
    yield
    SEEN.clear()


def test_a_progress_note_with_a_lone_surrogate_is_a_progress_error_and_the_job_succeeds():
    job = note_task.delay("surrogate")
    call_command("run_debounce_worker", burst=True)  # today: UnicodeEncodeError escapes
    assert SEEN == ["ProgressError"]
    row = Job.objects.get(pk=job.pk)
    assert row.status == Job.Status.SUCCESSFUL
    assert (row.progress_done, row.progress_note) == (1, "fine")


def test_a_progress_note_with_a_nul_is_a_progress_error():
    job = note_task.delay("nul")
    call_command("run_debounce_worker", burst=True)
    assert SEEN == ["ProgressError"]
    row = Job.objects.get(pk=job.pk)
    assert row.status == Job.Status.SUCCESSFUL
    assert (row.progress_done, row.progress_note) == (1, "fine")


@pytest.mark.parametrize("name", ["nightly\x00report", "nightly\ud800report"])
def test_a_settings_schedule_name_with_a_nul_is_refused_by_the_checks(name):
    value = {name: {"task": "badin.win", "cron": "* * * * *", "args": [1]}}
    with override_settings(DEBOUNCE_SCHEDULES=value):
        ids = [m.id for m in checks.run_checks() if (m.id or "").startswith("django_debounce.E04")]
        assert ids, "no check refused a schedule name no database can store"
        PeriodicScheduler().defer_due()  # and deferring never raises a database error
    assert not Job.objects.exists()


@pytest.mark.parametrize("now", ["tomorrow", 5, dt.datetime(2020, 1, 1), dt.date(2020, 1, 1)])
@pytest.mark.parametrize("action", ["flush", "cancel"])
def test_a_window_action_refuses_a_now_that_is_not_an_aware_datetime(action, now):
    job = win.delay(1)
    before = Job.objects.values().get(pk=job.pk)
    with pytest.raises(DebounceError, match="now"):
        getattr(win.window(1), action)(now=now)
    assert Job.objects.values().get(pk=job.pk) == before  # nothing written


def test_windows_for_a_single_str_is_refused():
    with pytest.raises(DebounceError):
        win.windows_for("k:1")


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
    assert "page 1\\nfake line\\x1b" in lines[at + 1]  # shown escaped, on the job's line
    assert [line for line in lines if "fake line" in line] == [lines[at + 1]]


def test_a_window_on_an_unknown_database_is_a_package_error():
    from django_debounce.ops.window_handles import Window

    with pytest.raises(DebounceError, match="nope"):
        Window("badin.win", "k:1", using="nope").inspect()
