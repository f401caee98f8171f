"""The Celery executor's side of the spans, in-process (decision 213).

``run_handed_off`` is what the Celery task ``django_debounce.run_job`` runs in a Celery
worker; here the test calls it after the dispatcher's claim (``claim_for_handoff``), as
tests/db/contrib/celery/ do. The real ``celery worker`` is in
tests/processes/contrib/celery/test_celery_tracing.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.contrib.celery import handoff
from django_debounce.exceptions import JobFailedError
from django_debounce.models import Job
from tests.testapp.tasks_tracing import celery_fails, celery_window

pytestmark = pytest.mark.django_db


def _handoff() -> list[Job]:
    return handoff.claim_for_handoff(scheduler_id="otl", limit=10, lease=dt.timedelta(seconds=30))


def _spans(exporter: Any, kind: SpanKind) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.kind == kind]


def test_a_handed_off_run_links_to_the_calls_and_the_claim_is_the_dispatchers(clock, otel_spans):
    tracer = otel_spans.provider.get_tracer("tests")
    parents = []
    for n in range(3):
        with tracer.start_as_current_span(f"request {n}") as parent:
            job = celery_window.delay(key="a", n=n)
        parents.append(parent.get_span_context())
    enqueues = _spans(otel_spans, SpanKind.PRODUCER)
    clock(seconds=11)
    assert [j.pk for j in _handoff()] == [job.pk]
    assert celery_executor.run_handed_off(job.pk) == 0  # the payload of the opening call
    (claim,) = _spans(otel_spans, SpanKind.CLIENT)
    assert claim.attributes["debounce.executor"] == "celery"
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert [link.context.trace_id for link in run.links] == [p.trace_id for p in parents]
    assert [link.context.span_id for link in run.links] == [s.context.span_id for s in enqueues]
    assert run.attributes["debounce.outcome"] == "succeeded"
    assert run.attributes["debounce.attempt"] == 1


def test_a_handed_off_run_that_fails_for_good_is_dead_lettered_with_its_error(clock, otel_spans):
    job = celery_fails.delay(3)
    _handoff()
    with pytest.raises(JobFailedError):
        celery_executor.run_handed_off(job.pk)
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.attributes["debounce.outcome"] == "dead_lettered"
    assert run.attributes["error.type"] == "tests.testapp.tasks_tracing.TracedError"
    assert run.status.status_code == StatusCode.ERROR


def test_a_job_taken_past_its_expiry_is_a_run_span_expired_linked_to_its_call(clock, otel_spans):
    job = celery_fails.apply_async(args=(4,), expires="10s")
    (enqueue,) = _spans(otel_spans, SpanKind.PRODUCER)
    _handoff()
    clock(seconds=11)  # the message waited in the broker past the job's expiry
    assert celery_executor.take_and_run(job.pk).job.status == Job.Status.EXPIRED
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.attributes["debounce.outcome"] == "expired"
    assert [link.context.span_id for link in run.links] == [enqueue.context.span_id]
    assert run.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_raising_span_processor_fails_no_handed_off_run_nor_its_expiry(
    where, clock, otel_spans, caplog
):
    from tests.db.tracing.test_tracing_attack import Raising

    otel_spans.provider.add_span_processor(Raising(where))
    ran = celery_window.delay(key="rp", n=5)
    gone = celery_fails.apply_async(args=(6,), expires="20s")
    clock(seconds=11)
    assert sorted(j.pk for j in _handoff()) == sorted([ran.pk, gone.pk])
    assert celery_executor.run_handed_off(ran.pk) == 5
    clock(seconds=30)
    assert celery_executor.take_and_run(gone.pk).job.status == Job.Status.EXPIRED
    assert Job.objects.get(pk=ran.pk).status == Job.Status.SUCCESSFUL
    assert "tracing failed" in caplog.text
