"""Every state change of a job is logged once, with the same ``extra`` fields (issue #11 item 4)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from django_debounce import registry
from django_debounce.models import Job
from tests.testapp import tasks_flow
from tests.testapp.tasks_metrics import burst as burst_task
from tests.testapp.tasks_metrics import fail, plain, unique

pytestmark = pytest.mark.django_db

FIELDS = (
    "debounce_job_id",
    "debounce_task",
    "debounce_queue",
    "debounce_attempt",
    "debounce_outcome",
    "debounce_duration",
)


def about(caplog: pytest.LogCaptureFixture, job_id: int) -> list[tuple[str, int, Any]]:
    """(outcome, level, duration) of every record about job ``job_id``, in order."""
    return [
        (r.debounce_outcome, r.levelno, r.debounce_duration)
        for r in caplog.records
        if getattr(r, "debounce_job_id", None) == job_id
    ]


def test_a_job_s_life_is_logged_with_its_fields(caplog, clock, burst):
    caplog.set_level(logging.DEBUG, logger="django_debounce")
    job = burst_task.delay("k")
    clock(seconds=3)
    burst_task.delay("k")
    clock(seconds=13)
    burst(queues=["metrics"])

    assert about(caplog, job.pk) == [
        ("created", logging.DEBUG, None),
        ("debounced", logging.DEBUG, None),
        ("claimed", logging.DEBUG, None),
        ("started", logging.INFO, None),
        ("succeeded", logging.INFO, 0.0),  # the frozen clock: the run took no time
    ]
    records = [r for r in caplog.records if getattr(r, "debounce_job_id", None) == job.pk]
    for record in records:
        assert {name: getattr(record, name) for name in FIELDS[:3]} == {
            "debounce_job_id": job.pk,
            "debounce_task": "met.burst",
            "debounce_queue": "metrics",
        }
        assert record.job_id == job.pk  # the older field stays for existing filters
    assert [r.debounce_attempt for r in records] == [0, 0, 1, 1, 1]


def test_a_coalesced_call_is_logged_as_such(caplog, clock):
    caplog.set_level(logging.DEBUG, logger="django_debounce")
    job = unique.delay("a")
    unique.delay("a")
    assert [outcome for outcome, _, _ in about(caplog, job.pk)] == ["created", "coalesced"]


def test_failures_retries_and_dead_letters_carry_attempt_and_duration(caplog, clock, burst):
    caplog.set_level(logging.INFO, logger="django_debounce")
    job = fail.delay("x")
    burst(queues=["metrics"])
    clock(seconds=5)
    burst(queues=["metrics"])

    assert about(caplog, job.pk) == [
        ("started", logging.INFO, None),
        ("raised", logging.ERROR, None),
        ("retried", logging.INFO, 0.0),
        ("started", logging.INFO, None),
        ("raised", logging.ERROR, None),
        ("dead_lettered", logging.WARNING, 0.0),
    ]
    attempts = [
        (r.debounce_outcome, r.debounce_attempt)
        for r in caplog.records
        if getattr(r, "debounce_job_id", None) == job.pk
    ]
    assert attempts[2] == ("retried", 1) and attempts[5] == ("dead_lettered", 2)
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def test_sheds_expiries_and_cancellations_are_logged(caplog, clock, burst, flow):
    caplog.set_level(logging.INFO, logger="django_debounce")
    jobs = [flow["flow.rate_drop"].delay(f"d{i}") for i in range(12)]
    stale = plain.apply_async(args=("late",), expires="1s")
    waiting = plain.apply_async(args=("after",), depends_on=[stale])
    clock(seconds=2)
    burst()

    shed = [r for r in caplog.records if getattr(r, "debounce_outcome", None) == "shed"]
    assert sorted(r.debounce_job_id for r in shed) == [job.pk for job in jobs[10:]]
    assert {(r.debounce_task, r.debounce_queue) for r in shed} == {("flow.rate_drop", "default")}
    expired = [r for r in caplog.records if getattr(r, "debounce_outcome", None) == "expired"]
    assert [r.debounce_job_ids for r in expired] == [[stale.pk]]
    cancelled = [r for r in caplog.records if getattr(r, "debounce_outcome", None) == "cancelled"]
    assert [r.debounce_job_ids for r in cancelled] == [[waiting.pk]]
    assert Job.objects.get(pk=waiting.pk).status == Job.Status.CANCELLED
    assert Job.objects.get(pk=stale.pk).finished_at is not None
