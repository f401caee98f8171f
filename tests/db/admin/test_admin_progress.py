"""The progress bar on the jobs list and the job page (decision 202): ``<progress>`` with its text."""

from __future__ import annotations

import datetime as dt

import pytest
from django.urls import reverse

from django_debounce.models import Job
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_debounce_job_changelist")
Status = Job.Status


def _running(**progress: object) -> Job:
    return JobFactory(
        status=Status.RUNNING,
        worker_id="w",
        attempts=1,
        started_at=T,
        lease_expires_at=T + dt.timedelta(minutes=5),
        progress_at=T + dt.timedelta(seconds=3),
        **progress,
    )


def test_the_list_shows_each_runs_bar_and_words(admin_client, clock):
    counted = _running(progress_done=3, progress_total=10, progress_note="files")
    open_ended = _running(progress_done=7)
    earlier_run = _running(progress_done=9, progress_total=9)
    Job.objects.filter(pk=earlier_run.pk).update(started_at=T + dt.timedelta(seconds=4))
    silent = JobFactory()
    html = admin_client.get(JOBS).content.decode()
    assert (
        '<span class="debounce-progress"><progress value="3" max="10" '
        'aria-label="3 of 10 (30%) - files"></progress> 3 of 10 (30%) - files</span>'
    ) in html
    assert (
        '<span class="debounce-progress"><progress aria-label="7 done"></progress> 7 done</span>'
    ) in html
    assert "9 of 9" not in html  # an earlier attempt's progress is not this run's
    assert html.count("<progress") == 2
    assert {counted.pk, open_ended.pk, earlier_run.pk, silent.pk} <= set(
        Job.objects.values_list("pk", flat=True)
    )


def test_the_job_page_shows_the_bar_and_an_empty_total_is_full(admin_client, clock):
    job = _running(progress_done=0, progress_total=0, progress_note="nothing to do")
    page = admin_client.get(reverse("admin:django_debounce_job_change", args=[job.pk]))
    html = page.content.decode()
    assert (
        '<progress value="1" max="1" aria-label="0 of 0 (100%) - nothing to do"></progress>' in html
    )
    none = JobFactory()
    html = admin_client.get(reverse("admin:django_debounce_job_change", args=[none.pk])).content
    assert b"<progress" not in html
