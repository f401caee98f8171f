"""``Job.run_reason``: why a job became due when it did, as the admin and the task context show it."""

from __future__ import annotations

import pytest

from django_debounce.models import Job
from tests.testapp.tasks_worker import debounced_fail, fail_times

pytestmark = pytest.mark.django_db


def test_a_retried_job_reports_retry_not_its_window(clock, burst):
    # Window 1m, max wait 10m: the first run is due because the window went quiet.
    job = debounced_fail.delay("k", "v1")
    assert job.run_reason == "quiet"
    clock(minutes=1)
    burst()
    job.refresh_from_db()
    # Waiting out its backoff: run_at is the backoff's now, not the window's.
    assert (job.status, job.attempts) == (Job.Status.READY, 1)
    assert job.run_reason == "retry"
    clock(hours=1)
    burst()
    job.refresh_from_db()
    assert job.attempts == 2 and job.run_reason == "retry"


def test_a_job_that_succeeded_first_time_keeps_its_reason(clock, burst):
    plain = fail_times.delay("ok", 0)
    burst()
    plain.refresh_from_db()
    assert (plain.status, plain.attempts, plain.run_reason) == (
        Job.Status.SUCCESSFUL,
        1,
        "not_debounced",
    )
