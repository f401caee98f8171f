"""A call never joins a window (or coalesces into a job) that expired before a worker started it.

Workers down past a window's ``expires_at``: the window will end EXPIRED at the
next claim, so a call arriving now must not slide into it and be lost with it.
The call ends that window EXPIRED (cancelling its dependents) and opens a new
one (§4.1, §6; decision 49). Both write paths are covered: the one-statement
upsert (``dep.window``) and the ORM path of a merge task (``coal.gather``), plus
a coalescing key (``coal.charge``).
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job
from tests.conftest import T
from tests.testapp.models import CallLog
from tests.testapp.tasks_coalesce import charge, gather
from tests.testapp.tasks_flow_deps import step, window

pytestmark = pytest.mark.django_db

Status = Job.Status


def test_call_after_expiry_opens_a_new_window(clock, burst):
    # window: debounce 1m, max wait 10m; expires 15m, so the window is stale from T+15m.
    first = window.apply_async(args=("k", 1), expires="15m")
    dependent = step.apply_async(args=("after-first",), depends_on=[first])
    clock(minutes=15)
    second = window.apply_async(args=("k", 2), expires="15m")

    assert second.outcome == "created" and second.pk != first.pk
    assert second.run_at == T + dt.timedelta(minutes=16)
    first.refresh_from_db()
    assert (first.status, first.finished_at, first.enqueue_count) == (
        Status.EXPIRED,
        T + dt.timedelta(minutes=15),
        1,
    )
    assert not first.is_open_window
    dependent.refresh_from_db()
    assert dependent.status == Status.CANCELLED

    clock(minutes=16)
    burst()
    second.refresh_from_db()
    assert second.status == Status.SUCCESSFUL
    assert list(CallLog.objects.values_list("key", flat=True)) == ["k:2"]
    assert DeadLetter.objects.count() == 0


def test_call_just_before_expiry_still_slides(clock):
    first = window.apply_async(args=("k", 1), expires="15m")
    clock(minutes=14, seconds=59)
    again = window.apply_async(args=("k", 2), expires="15m")
    assert (again.pk, again.outcome, again.enqueue_count) == (first.pk, "debounced", 2)
    assert Job.objects.count() == 1


def test_merge_path_after_expiry_opens_a_new_window(clock):
    first = gather.apply_async(args=("g",), kwargs={"ids": [1]}, expires="5s")
    clock(seconds=5)
    second = gather.apply_async(args=("g",), kwargs={"ids": [2]}, expires="5s")
    assert second.outcome == "created" and second.pk != first.pk
    assert second.kwargs == {"ids": [2]}  # nothing merged from the expired window
    first.refresh_from_db()
    assert first.status == Status.EXPIRED


def test_coalescing_key_of_an_expired_job_creates_a_new_job(clock):
    first = charge.apply_async(args=("c",), countdown="10m", expires="30m")
    clock(minutes=10)
    same = charge.apply_async(args=("c",), countdown="10m", expires="30m")
    assert (same.pk, same.outcome) == (first.pk, "coalesced")
    clock(minutes=30)
    fresh = charge.apply_async(args=("c",), countdown="10m", expires="30m")
    assert fresh.outcome == "created" and fresh.pk != first.pk
    first.refresh_from_db()
    assert first.status == Status.EXPIRED
    assert Job.objects.filter(status=Status.READY).count() == 1


@pytest.mark.parametrize(
    "options",
    [
        {"expires": T - dt.timedelta(seconds=1)},
        {"expires": T},
        {"countdown": "10m", "expires": "5m"},
        {"countdown": "10m", "expires": "10m"},
        {"eta": T + dt.timedelta(hours=1), "expires": T + dt.timedelta(minutes=30)},
    ],
    ids=["past", "now", "before-countdown", "at-countdown", "before-eta"],
)
def test_an_expiry_no_worker_could_meet_is_refused(clock, options):
    with pytest.raises(ConfigurationError, match="would expire before any worker could start it"):
        step.apply_async(args=("x",), **options)
    assert Job.objects.count() == 0
