"""The periodic ticks page: read-only, bounded, the schedules on top (decision 177)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_debounce import Schedule, registry, task
from django_debounce.admin.helpers import time_text
from django_debounce.models import Job, PeriodicTick
from django_debounce.ops.periodic import PeriodicScheduler
from tests.conftest import T

URL = "admin:django_debounce_periodictick_changelist"


@pytest.fixture
def every_minute():
    @task(name="per.admin", schedule=Schedule("* * * * *", tz="UTC", name="minutely", overlap=True))
    def body() -> None: ...

    yield body
    registry.unregister("per.admin")


@pytest.mark.django_db
def test_the_ticks_page_lists_ticks_with_their_jobs_and_the_schedules(
    admin_client, clock, every_minute
):
    scheduler = PeriodicScheduler(scheduler_id="w1")
    for minute in range(60):
        clock(at=T + dt.timedelta(minutes=minute, seconds=3))
        scheduler.defer_due()
    assert PeriodicTick.objects.count() == 60
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse(URL), {"schedule": "minutely"})
    assert response.status_code == 200
    assert len(queries) <= 10
    rows = response.context["cl"].result_list
    assert len(rows) == 50 and rows[0].tick == T + dt.timedelta(minutes=59)
    newest = Job.objects.filter(task_name="per.admin").latest("id")
    page = response.content.decode()
    assert f"#{newest.pk}</a>" in page and "3.0 s" in page
    (schedule,) = response.context["debounce_schedules"]
    assert (schedule["name"], schedule["next_tick"]) == (
        "minutely",
        (T + dt.timedelta(minutes=60)).isoformat(),
    )
    assert "<code>* * * * *</code>" in page
    # The instants as the ticks' column shows them, not ISO strings.
    assert schedule["next_tick_text"] == time_text(T + dt.timedelta(minutes=60))
    assert f"<td>{schedule['next_tick_text']}</td>" in page
    assert schedule["next_tick"] not in page


@pytest.mark.django_db
def test_the_ticks_page_is_read_only(admin_client, clock, every_minute):
    clock(at=T)
    PeriodicScheduler().defer_due()
    tick = PeriodicTick.objects.get()
    assert admin_client.get(reverse("admin:django_debounce_periodictick_add")).status_code == 403
    delete = reverse("admin:django_debounce_periodictick_delete", args=[tick.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    detail = admin_client.get(reverse("admin:django_debounce_periodictick_change", args=[tick.pk]))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
