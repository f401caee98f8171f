"""Expiry (§6, §11, B40): a job not started by its expiry ends EXPIRED, never runs, cancels dependents."""

from __future__ import annotations

import datetime as dt

import pytest

from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job
from tests.conftest import T
from tests.testapp.models import CallLog
from tests.testapp.tasks_flow_deps import refresh, step, window

pytestmark = pytest.mark.django_db

Status = Job.Status


def test_b40_stale_backlog_expires(clock, burst, signal_log):
    """refresh(expires="5m") once a minute T…T+9m, no worker until run@T+10m30s."""
    jobs = []
    for minute in range(10):
        clock(minutes=minute)
        jobs.append(refresh.apply_async(args=(minute,), expires="5m"))
    assert [j.expires_at for j in jobs] == [T + dt.timedelta(minutes=m + 5) for m in range(10)]
    clock(minutes=0)
    dependent = step.apply_async(args=("after-T",), depends_on=[jobs[0]])
    signal_log.clear()

    clock(minutes=10, seconds=30)
    burst()

    by_id = {job.pk: job for job in Job.objects.all()}
    expired, fresh = jobs[:6], jobs[6:]
    for job in expired:
        row = by_id[job.pk]
        assert (row.status, row.attempts, row.started_at) == (Status.EXPIRED, 0, None)
        assert row.finished_at == T + dt.timedelta(minutes=10, seconds=30)
    assert [by_id[j.pk].status for j in fresh] == [Status.SUCCESSFUL] * 4
    ran = CallLog.objects.filter(task="dep.refresh").order_by("id").values_list("key", flat=True)
    assert list(ran) == ["6", "7", "8", "9"]
    assert by_id[dependent.pk].status == Status.CANCELLED
    assert not CallLog.objects.filter(task="dep.step").exists()
    # Planned outcomes: no dead letter, and no signal for the expired or cancelled jobs (§8).
    assert DeadLetter.objects.count() == 0
    signalled = {kw["job"].pk for _, kw, _ in signal_log}
    assert signalled == {j.pk for j in fresh}


def test_expires_as_aware_datetime(clock, burst):
    job = step.apply_async(args=("x",), countdown="1m", expires=T + dt.timedelta(minutes=5))
    assert job.expires_at == T + dt.timedelta(minutes=5)
    clock(minutes=10)
    burst()
    job.refresh_from_db()
    assert job.status == Status.EXPIRED
    assert not CallLog.objects.exists()


def test_job_started_before_its_expiry_runs(clock, burst):
    job = step.apply_async(args=("x",), countdown="4m59s", expires="5m")
    clock(minutes=4, seconds=59)
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCESSFUL


def test_expiry_at_the_instant_counts_as_expired(clock, burst):
    job = step.apply_async(args=("x",), countdown="1m", expires="5m")
    clock(minutes=5)
    burst()
    job.refresh_from_db()
    assert job.status == Status.EXPIRED


@pytest.mark.parametrize(
    "expires, message",
    [
        ("soon", "expires='soon' is not a duration"),
        (0, "must be longer than zero"),
        (dt.datetime(2026, 3, 1, 13, 0), "is naive; pass an aware datetime"),
    ],
)
def test_bad_expires_is_an_error(clock, expires, message):
    with pytest.raises(ConfigurationError, match=message):
        step.apply_async(args=("x",), expires=expires)
    assert Job.objects.count() == 0


def test_debounced_expiry_not_before_max_wait(clock):
    with pytest.raises(ConfigurationError, match="expires is sooner than the max wait"):
        window.apply_async(args=("k",), expires="9m")
    job = window.apply_async(args=("k",), expires="10m")
    assert job.expires_at == T + dt.timedelta(minutes=10)


def test_slide_keeps_the_openers_expiry(clock, burst):
    opener = window.apply_async(args=("k",), expires="1h")
    clock(minutes=1)
    slid = window.apply_async(args=("k", 1), expires="2h")
    assert slid.pk == opener.pk and slid.outcome == "debounced"
    assert slid.expires_at == T + dt.timedelta(hours=1)
    opener.refresh_from_db()
    assert opener.expires_at == T + dt.timedelta(hours=1)


def test_expiry_cancels_a_chain(clock, burst):
    head = step.apply_async(args=("head",), countdown="1m", expires="5m")
    mid = step.apply_async(args=("mid",), depends_on=[head])
    tail = step.apply_async(args=("tail",), depends_on=[mid])
    clock(minutes=10)
    burst()
    statuses = [Job.objects.get(pk=j.pk).status for j in (head, mid, tail)]
    assert statuses == [Status.EXPIRED, Status.CANCELLED, Status.CANCELLED]
    assert not CallLog.objects.exists()
