"""OpenTelemetry spans of enqueues, claims and runs through the built-in worker (decisions 211-213).

Spans go to the SDK's in-memory exporter of a provider this test gives django_debounce
(``otel_spans`` in tests/conftest.py). A debounced job carries the trace context of every
call that joined its window, so its run's span links to each of them (not one parent).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry.trace import SpanKind, StatusCode

from django_debounce.models import Job
from tests.testapp import tasks_tracing
from tests.testapp.tasks_tracing import fails, plain, unique, window

pytestmark = pytest.mark.django_db


def _spans(exporter: Any, kind: SpanKind) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.kind == kind]


def test_each_enqueue_is_a_producer_span_naming_its_outcome(clock, otel_spans):
    opened = window.delay(key="a")
    slid = window.delay(key="a")
    single = plain.delay(1)
    first = unique.delay("k")
    joined = unique.delay("k")
    spans = _spans(otel_spans, SpanKind.PRODUCER)
    assert [s.attributes["debounce.outcome"] for s in spans] == [
        "created",
        "debounced",
        "created",
        "created",
        "coalesced",
    ]
    assert [s.attributes["messaging.message.id"] for s in spans] == [
        str(job.pk) for job in (opened, slid, single, first, joined)
    ]
    assert spans[0].name == "enqueue otl.window"
    assert spans[0].attributes["messaging.system"] == "django_debounce"
    assert spans[0].attributes["messaging.destination.name"] == "default"
    assert spans[1].attributes["debounce.enqueue_count"] == 2
    # The key's hash, never its text (keys may hold user data).
    assert spans[0].attributes["debounce.key_hash"] == opened.window_key
    assert all("w:a" not in str(value) for s in spans for value in s.attributes.values())
    assert "debounce.key_hash" not in spans[2].attributes
    assert spans[4].attributes["debounce.key_hash"] == first.unique_lock


def test_a_burst_of_three_calls_runs_once_linked_to_each_call(clock, otel_spans, burst):
    tracer = otel_spans.provider.get_tracer("tests")
    parents = []
    for n in range(3):
        with tracer.start_as_current_span(f"request {n}") as parent:
            window.delay(key="b", n=n)
        parents.append(parent.get_span_context())
    assert len({p.trace_id for p in parents}) == 3
    job = Job.objects.get(task_name="otl.window")
    assert job.trace_links["calls"] == 3 and len(job.trace_links["links"]) == 3

    enqueues = _spans(otel_spans, SpanKind.PRODUCER)
    assert [s.parent.span_id for s in enqueues] == [p.span_id for p in parents]
    otel_spans.clear()
    tasks_tracing.INSIDE.clear()
    clock(seconds=11)
    burst()

    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.name == "run otl.window"
    assert [link.context.trace_id for link in run.links] == [p.trace_id for p in parents]
    assert [link.context.span_id for link in run.links] == [s.context.span_id for s in enqueues]
    assert run.attributes["debounce.outcome"] == "succeeded"
    assert run.attributes["messaging.message.id"] == str(job.pk)
    assert run.attributes["debounce.attempt"] == 1
    assert run.attributes["debounce.enqueue_count"] == 3
    assert run.status.status_code == StatusCode.UNSET
    # The run's span is current while the task runs: the task's own spans are its children.
    assert tasks_tracing.INSIDE == [run.context.span_id]
    (claim,) = _spans(otel_spans, SpanKind.CLIENT)
    assert claim.attributes["messaging.batch.message_count"] == 1
    assert claim.attributes["debounce.queues"] == ("default",)


def test_a_long_burst_keeps_the_first_and_the_latest_links_and_counts_the_rest(
    clock, otel_spans, burst
):
    tracer = otel_spans.provider.get_tracer("tests")
    traces = []
    for n in range(40):
        with tracer.start_as_current_span(f"request {n}") as parent:
            window.delay(key="c", n=n)
        traces.append(parent.get_span_context().trace_id)
    job = Job.objects.get(task_name="otl.window")
    assert job.enqueue_count == 40
    assert job.trace_links["calls"] == 40
    assert len(job.trace_links["links"]) == 32
    otel_spans.clear()
    clock(seconds=11)
    burst()
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert [link.context.trace_id for link in run.links] == [traces[0], *traces[9:]]
    assert run.attributes["debounce.links"] == 32
    assert run.attributes["debounce.links_left_out"] == 8


def test_a_failing_run_records_its_error_then_its_dead_letter(clock, otel_spans, burst):
    job = fails.delay(7)
    burst()
    clock(hours=1)
    burst()
    runs = _spans(otel_spans, SpanKind.CONSUMER)
    assert [r.attributes["debounce.outcome"] for r in runs] == ["retried", "dead_lettered"]
    assert [r.attributes["debounce.attempt"] for r in runs] == [1, 2]
    for run in runs:
        assert run.status.status_code == StatusCode.ERROR
        assert run.attributes["error.type"] == "tests.testapp.tasks_tracing.TracedError"
        (event,) = run.events
        assert event.name == "exception"
        assert event.attributes["exception.message"] == "run 7 failed"
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED


def test_a_window_opened_untraced_carries_only_the_traced_calls(clock, otel_spans):
    from django_debounce.tracing import use_tracer_provider

    use_tracer_provider(None)
    window.delay(key="d")
    use_tracer_provider(otel_spans.provider)
    window.delay(key="d")
    job = Job.objects.get(task_name="otl.window")
    assert job.enqueue_count == 2
    assert job.trace_links["calls"] == 1 and len(job.trace_links["links"]) == 1


def test_with_tracing_off_nothing_is_written_and_the_sql_leaves_the_column_out(clock, burst):
    with CaptureQueriesContext(connection) as queries:
        window.delay(key="e")
        window.delay(key="e")
        plain.delay(2)
    assert list(Job.objects.values_list("trace_links", flat=True)) == [None, None]
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert inserts and all("trace_links" not in sql.split("VALUES")[0] for sql in inserts)
    clock(seconds=11)
    burst()
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCESSFUL}


def test_a_bulk_enqueue_is_one_span_and_each_of_its_jobs_links_to_it(clock, otel_spans, burst):
    from django_debounce import enqueue_many

    jobs = enqueue_many(
        [
            (window, (), {"key": "f", "n": 1}),
            (window, (), {"key": "f", "n": 2}),
            (window, (), {"key": "g"}),
            (plain, (3,)),
        ]
    )
    (span,) = _spans(otel_spans, SpanKind.PRODUCER)
    assert span.name == "enqueue_many"
    assert span.attributes["messaging.batch.message_count"] == 4
    assert (span.attributes["debounce.created"], span.attributes["debounce.debounced"]) == (3, 1)
    for job in {job.pk: job for job in jobs}.values():
        stored = Job.objects.get(pk=job.pk).trace_links
        assert stored["calls"] == 1 and len(stored["links"]) == 1, job
    otel_spans.clear()
    clock(seconds=11)
    burst()
    runs = _spans(otel_spans, SpanKind.CONSUMER)
    assert len(runs) == 3
    assert {link.context.span_id for run in runs for link in run.links} == {span.context.span_id}


def test_a_bulk_enqueue_with_tracing_off_writes_no_trace_context(clock):
    from django_debounce import enqueue_many

    enqueue_many([(window, (), {"key": "h"}), (window, (), {"key": "h"}), (plain, (4,))])
    assert list(Job.objects.values_list("trace_links", flat=True)) == [None, None]


def test_an_enqueue_whose_write_is_refused_ends_its_span_with_the_error(clock, otel_spans):
    from django_debounce.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="do not exist"):
        plain.apply_async(args=(5,), depends_on=[987654])
    (span,) = _spans(otel_spans, SpanKind.PRODUCER)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "django_debounce.exceptions.ConfigurationError"
    assert "debounce.outcome" not in span.attributes
    assert Job.objects.count() == 0
