"""``debounce_status`` lists the running jobs that reported progress (decision 202)."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command

from django_debounce.models import Job
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
Status = Job.Status


def _running(started: dt.datetime, **fields: object) -> Job:
    return JobFactory(
        status=Status.RUNNING,
        worker_id="w1",
        attempts=1,
        started_at=started,
        lease_expires_at=T + 60 * S,
        **fields,
    )


def _seed() -> tuple[Job, Job]:
    later = _running(
        T - 5 * S,
        task_name="reports.build",
        progress_done=3,
        progress_total=4,
        progress_note="pages",
        progress_at=T - S,
    )
    earlier = _running(T - 50 * S, task_name="mail.send_all", progress_done=120, progress_at=T)
    _running(T - 9 * S, progress_done=9, progress_at=T - 10 * S)  # an earlier attempt's value
    _running(T - 9 * S)  # reported nothing
    JobFactory(status=Status.SUCCESSFUL, progress_done=1, progress_total=1, progress_at=T)
    return earlier, later


def test_json_lists_running_jobs_with_this_runs_progress_longest_running_first(clock):
    earlier, later = _seed()
    out = io.StringIO()
    call_command("debounce_status", format="json", stdout=out)
    assert json.loads(out.getvalue())["progress"] == [
        {
            "id": earlier.pk,
            "task_name": "mail.send_all",
            "queue": "default",
            "done": 120,
            "total": None,
            "percent": None,
            "note": "",
            "at": T.isoformat(),
        },
        {
            "id": later.pk,
            "task_name": "reports.build",
            "queue": "default",
            "done": 3,
            "total": 4,
            "percent": 75,
            "note": "pages",
            "at": (T - S).isoformat(),
        },
    ]


def test_text_shows_them_under_their_heading_and_nothing_without_any(clock):
    earlier, later = _seed()
    out = io.StringIO()
    call_command("debounce_status", stdout=out)
    lines = out.getvalue().splitlines()
    at = lines.index("running jobs with progress")
    assert [line.split() for line in lines[at + 1 : at + 3]] == [
        [f"#{earlier.pk}", "mail.send_all", "120", "done"],
        [f"#{later.pk}", "reports.build", "3", "of", "4", "(75%)", "-", "pages"],
    ]
    assert max(len(line) for line in lines) <= 80
    Job.objects.all().delete()
    out = io.StringIO()
    call_command("debounce_status", stdout=out)
    assert "running jobs with progress" not in out.getvalue()
