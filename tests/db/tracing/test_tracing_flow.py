"""Tracing on with flow control: rate limits (held back, shed), caps and a circuit breaker.

A job held back at a claim has no run span (it did not run); a shed job neither; every
job that ran has exactly one run span naming its outcome, and the claims' spans count
only the jobs they took.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

from django_debounce import registry
from django_debounce.models import Job
from tests.testapp import tasks_flow

pytestmark = pytest.mark.django_db


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    """Register the flow-control tasks for one test (they gate every claim), then forget them."""
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def _spans(exporter: Any, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


def test_held_back_and_shed_jobs_have_no_run_span(clock, otel_spans, burst, flow):
    held = [flow["flow.rate"].delay(f"r{i}") for i in range(15)]
    shed = [flow["flow.rate_drop"].delay(f"d{i}") for i in range(15)]
    burst()
    runs = _spans(otel_spans, SpanKind.CONSUMER)
    by_job = Counter(r.attributes["messaging.message.id"] for r in runs)
    statuses = {j.pk: j.status for j in Job.objects.all()}
    ran = {str(pk) for pk, status in statuses.items() if status == Job.Status.SUCCESSFUL}
    assert set(by_job) == ran and set(by_job.values()) == {1}
    assert len([j for j in held if statuses[j.pk] == Job.Status.SUCCESSFUL]) == 10
    assert len([j for j in shed if statuses[j.pk] == Job.Status.SUCCESSFUL]) == 10
    assert {r.attributes["debounce.outcome"] for r in runs} == {"succeeded"}
    claims = _spans(otel_spans, SpanKind.CLIENT)
    assert sum(c.attributes["messaging.batch.message_count"] for c in claims) >= len(runs)
    # The held jobs run later, each once more traced.
    otel_spans.clear()
    clock(seconds=2)
    burst()
    later = _spans(otel_spans, SpanKind.CONSUMER)
    assert len(later) == 5
    assert {r.attributes["debounce.outcome"] for r in later} == {"succeeded"}


def test_a_tripped_breaker_and_a_cap_traced(clock, otel_spans, burst, flow):
    for i in range(5):
        flow["flow.guarded"].delay(f"g{i}")
    for i in range(4):
        flow["flow.capped"].delay(f"c{i}")
    burst()
    runs = _spans(otel_spans, SpanKind.CONSUMER)
    outcomes = Counter(
        (r.attributes["debounce.task"], r.attributes["debounce.outcome"]) for r in runs
    )
    finished = Counter(
        (j.task_name, j.status) for j in Job.objects.exclude(status=Job.Status.READY)
    )
    want = {"SUCCESSFUL": "succeeded", "FAILED": "dead_lettered"}
    # Every job that ended by a run has a run span of that outcome; held jobs have none.
    for (name, status), n in finished.items():
        if status in want:
            assert outcomes[(name, want[status])] >= n, (name, status, outcomes)
