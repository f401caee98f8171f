"""Tracing on with the other features: edges, dependencies, expiry, dead letters and their
retry, cancels and window handles, timeouts, progress, the Django ``@task`` backend.

Each feature must work as it does untraced, and its spans must say what happened.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

from django_debounce.models import DeadLetter, Job
from tests.testapp import tasks_ota
from tests.testapp.tasks_ota import fails, lead, plain, progress, slow, window

pytestmark = pytest.mark.django_db


def _runs(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]


def _calls(exporter: Any, key: str, count: int, task: Any = window) -> list[int]:
    tracer = exporter.provider.get_tracer("tests")
    ids = []
    for n in range(count):
        with tracer.start_as_current_span(f"request {n}"):
            task.delay(key=key, n=n)
        ids.append(
            [s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER][
                -1
            ].context.span_id
        )
    return ids


def test_both_edges_the_leading_run_links_its_call_the_swallowed_calls_are_not_linked(
    clock, otel_spans, burst
):
    ids = _calls(otel_spans, "e", 1, lead)
    burst()
    (first,) = _runs(otel_spans)
    assert [link.context.span_id for link in first.links] == ids
    assert first.attributes["debounce.outcome"] == "succeeded"
    later = _calls(otel_spans, "e", 3, lead)
    otel_spans.clear()
    clock(seconds=30)
    burst()
    runs = _runs(otel_spans)
    assert [r.attributes["debounce.outcome"] for r in runs] == ["succeeded"]
    linked = [link.context.span_id for link in runs[0].links]
    assert linked and set(linked) <= set(later)
    assert runs[0].attributes["debounce.links"] == len(linked)


def test_a_dependent_job_and_an_expired_job(clock, otel_spans, burst):
    first = plain.delay(1)
    after = plain.apply_async(args=(2,), depends_on=[first])
    gone = plain.apply_async(args=(3,), expires=dt.timedelta(seconds=5))
    clock(seconds=10)
    tasks_ota.RAN.clear()
    burst()
    assert sorted(tasks_ota.RAN) == [1, 2]
    assert Job.objects.get(pk=gone.pk).status == Job.Status.EXPIRED
    outcomes = {
        r.attributes["messaging.message.id"]: r.attributes["debounce.outcome"]
        for r in _runs(otel_spans)
    }
    assert outcomes[str(first.pk)] == outcomes[str(after.pk)] == "succeeded"
    assert outcomes.get(str(gone.pk), "expired") == "expired"


def test_a_dead_letter_retried_from_ops_runs_linked_to_the_retry_call(clock, otel_spans, burst):
    from django_debounce.ops.dead_letters import retry_dead_letter

    job = fails.delay(1)
    burst()
    (run,) = _runs(otel_spans)
    assert run.attributes["debounce.outcome"] == "dead_lettered"
    letter = DeadLetter.objects.get(job=job)
    tracer = otel_spans.provider.get_tracer("tests")
    with tracer.start_as_current_span("POST /admin/retry") as request:
        again = retry_dead_letter(letter)
    assert again is not None and again.pk != job.pk
    stored = Job.objects.get(pk=again.pk).trace_links
    assert stored["calls"] == 1
    otel_spans.clear()
    burst()
    (rerun,) = _runs(otel_spans)
    assert rerun.attributes["debounce.outcome"] == "dead_lettered"
    (link,) = rerun.links
    (enqueue,) = [s for s in otel_spans.get_finished_spans() if s.kind == SpanKind.PRODUCER] or [
        None
    ]
    # The retry is a new call: its run links to the retry's enqueue, in the operator's trace.
    assert link.context.trace_id == request.get_span_context().trace_id


def test_window_flush_and_cancel_and_a_cancelled_job(clock, otel_spans, burst):
    ids = _calls(otel_spans, "f", 3)
    window.window(key="f").flush()
    _calls(otel_spans, "g", 2)
    window.window(key="g").cancel()
    doomed = plain.delay(9)
    Job.objects.get(pk=doomed.pk).cancel()
    otel_spans.clear()
    tasks_ota.RAN.clear()
    burst()
    assert tasks_ota.RAN == [0]
    (run,) = _runs(otel_spans)
    assert [link.context.span_id for link in run.links] == ids
    assert Job.objects.get(pk=doomed.pk).status == Job.Status.CANCELLED


def test_a_timed_out_run_says_so(clock, otel_spans, burst):
    job = slow.delay(2.0)
    burst()
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    (run,) = _runs(otel_spans)
    assert run.attributes["debounce.outcome"] == "dead_lettered"
    assert run.attributes["debounce.timed_out"] is True


def test_progress_reports_inside_a_traced_run(clock, otel_spans, burst):
    job = progress.delay(5)
    burst()
    row = Job.objects.get(pk=job.pk)
    assert row.status == Job.Status.SUCCESSFUL and row.progress_note == "done"
    (run,) = _runs(otel_spans)
    assert run.attributes["debounce.outcome"] == "succeeded"


def test_the_django_task_backend_is_traced_like_a_task(clock, otel_spans, burst):
    from tests.testapp.tasks_django import report

    tracer = otel_spans.provider.get_tracer("tests")
    for n in range(3):
        with tracer.start_as_current_span(f"request {n}"):
            report.enqueue(user_id=41, revision=n)
    enqueues = [s for s in otel_spans.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert [s.attributes["debounce.outcome"] for s in enqueues] == [
        "created",
        "debounced",
        "debounced",
    ]
    otel_spans.clear()
    clock(seconds=11)
    burst()
    (run,) = _runs(otel_spans)
    assert [link.context.span_id for link in run.links] == [s.context.span_id for s in enqueues]
    assert run.attributes["debounce.outcome"] == "succeeded"
