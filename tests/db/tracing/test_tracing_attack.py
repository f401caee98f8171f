"""Attacks on the OpenTelemetry tracing: corrupt rows, a raising SDK, a provider that comes and goes.

Tracing is an observer: nothing it meets (a ``trace_links`` value edited by hand, a span
processor that raises, a provider switched off between enqueue and run) may fail the
enqueue or the run (decisions 227, 228).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind

from django_debounce.models import Job
from django_debounce.tracing import MAX_LINKS, use_tracer_provider
from tests.testapp import tasks_ota
from tests.testapp.tasks_ota import plain, window

pytestmark = pytest.mark.django_db

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _spans(exporter: Any, kind: SpanKind) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.kind == kind]


CORRUPT = [
    "not a dict",
    [1, 2, 3],
    42,
    {"calls": "many", "links": "nope"},
    {"calls": 1.5, "links": {"traceparent": VALID}},
    {"calls": True, "links": [5, None, "x", {"traceparent": "garbage"}]},
    {"calls": -3, "links": [{"traceparent": 7, "tracestate": ["x"]}]},
    {"calls": 10**30, "links": [{"traceparent": VALID}]},
    {"links": [{"traceparent": VALID, "tracestate": "=,=,\x01 ~~"}]},
    {},
]


@pytest.mark.parametrize("stored", CORRUPT, ids=range(len(CORRUPT)))
def test_a_hand_edited_trace_links_neither_breaks_a_slide_nor_the_run(
    stored, clock, otel_spans, burst
):
    tracer = otel_spans.provider.get_tracer("tests")
    opened = window.delay(key="corrupt", n=1)
    Job.objects.filter(pk=opened.pk).update(trace_links=stored)
    with tracer.start_as_current_span("request") as request:
        slid = window.delay(key="corrupt", n=2)  # slides over the corrupt value
    assert slid.pk == opened.pk and slid.outcome == "debounced"
    tasks_ota.RAN.clear()
    otel_spans.clear()
    clock(seconds=11)
    burst()
    assert tasks_ota.RAN == [1]  # a window runs its first call's payload
    job = Job.objects.get(pk=opened.pk)
    assert job.status == Job.Status.SUCCESSFUL
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.attributes["debounce.outcome"] == "succeeded"
    ids = [link.context.span_id for link in run.links]
    # The slide's own call is linked; of the corrupt value, at most its one valid carrier.
    assert ids[-1] == request.get_span_context().span_id or ids[-1] != 0
    assert len(ids) <= 2
    assert run.attributes["debounce.links"] == len(ids)


@pytest.mark.parametrize("stored", CORRUPT, ids=range(len(CORRUPT)))
def test_a_hand_edited_trace_links_does_not_break_a_run_it_was_not_slid_over(
    stored, clock, otel_spans, burst
):
    job = plain.delay(3)
    Job.objects.filter(pk=job.pk).update(trace_links=stored)
    tasks_ota.RAN.clear()
    burst()
    assert tasks_ota.RAN == [3]
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.attributes["debounce.outcome"] == "succeeded"
    assert run.attributes.get("debounce.links_left_out", 0) >= 0


def test_an_old_row_with_null_trace_links_runs_and_slides(clock, otel_spans, burst):
    use_tracer_provider(None)
    job = window.delay(key="old", n=1)
    assert Job.objects.get(pk=job.pk).trace_links is None
    use_tracer_provider(otel_spans.provider)
    tasks_ota.RAN.clear()
    clock(seconds=11)
    burst()
    assert tasks_ota.RAN == [1]
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert run.links == () or list(run.links) == []
    assert run.attributes["debounce.links"] == 0


def test_a_provider_switched_off_between_enqueue_and_run_runs_untraced(clock, otel_spans, burst):
    window.delay(key="sw", n=1)
    window.delay(key="sw", n=2)
    use_tracer_provider(None)
    tasks_ota.RAN.clear()
    otel_spans.clear()
    clock(seconds=11)
    burst()
    assert tasks_ota.RAN == [1]  # a window runs its first call's payload
    assert otel_spans.get_finished_spans() == ()
    assert Job.objects.get().trace_links["calls"] == 2


class Raising(SpanProcessor):
    """A span processor that raises wherever the SDK calls it."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("processor on_start broke")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("processor on_end broke")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_raising_span_processor_fails_neither_the_enqueue_nor_the_run(
    where, clock, otel_spans, burst, caplog
):
    otel_spans.provider.add_span_processor(Raising(where))
    with caplog.at_level(logging.WARNING, logger="django_debounce"):
        first = window.delay(key="rp", n=1)
        window.delay(key="rp", n=2)
        plain.delay(4)
        from django_debounce import enqueue_many

        enqueue_many([(plain, (5,)), (window, (), {"key": "rp", "n": 3})])
        tasks_ota.RAN.clear()
        clock(seconds=11)
        burst()
    assert sorted(tasks_ota.RAN) == [1, 4, 5]
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCESSFUL}
    assert Job.objects.get(pk=first.pk).enqueue_count == 3
    assert any("trac" in r.getMessage() for r in caplog.records)


def test_a_raising_global_propagator_is_not_used(clock, otel_spans, burst):
    from opentelemetry import propagate
    from opentelemetry.propagators.textmap import TextMapPropagator

    class Broken(TextMapPropagator):
        def inject(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("propagator broke")

        def extract(self, *a: Any, **k: Any) -> Any:
            raise RuntimeError("propagator broke")

        @property
        def fields(self) -> set[str]:
            return set()

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(Broken())
    try:
        window.delay(key="pp", n=1)
        window.delay(key="pp", n=2)
        tasks_ota.RAN.clear()
        clock(seconds=11)
        burst()
    finally:
        propagate.set_global_textmap(before)
    assert tasks_ota.RAN == [1]  # a window runs its first call's payload
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert len(run.links) == 2


@pytest.mark.slow
def test_ten_thousand_calls_keep_32_links_and_count_every_call(clock, otel_spans, burst):
    tracer = otel_spans.provider.get_tracer("tests")
    spans = []
    for n in range(10_000):
        with tracer.start_as_current_span("r") as request:
            window.delay(key="big", n=n)
        if n == 0 or n >= 10_000 - (MAX_LINKS - 1):
            spans.append(request.get_span_context().trace_id)  # each request its own trace
    job = Job.objects.get()
    assert job.enqueue_count == 10_000
    assert job.trace_links["calls"] == 10_000
    assert len(job.trace_links["links"]) == MAX_LINKS
    import json

    assert len(json.dumps(job.trace_links)) < 2600
    otel_spans.clear()
    tasks_ota.RAN.clear()
    clock(seconds=11)
    burst()
    assert tasks_ota.RAN == [0]
    (run,) = _spans(otel_spans, SpanKind.CONSUMER)
    assert [link.context.trace_id for link in run.links] == spans
    assert run.attributes["debounce.links_left_out"] == 10_000 - MAX_LINKS


def test_a_traced_row_slides_and_runs_in_a_process_without_the_api(
    clock, otel_spans, burst, monkeypatch
):
    import sys

    from django_debounce.tracing import provider

    window.delay(key="noapi", n=1)
    stored = Job.objects.get().trace_links
    otel_spans.clear()
    # The API "not installed" (as tests/unit/tracing/test_tracing_off.py does it).
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(provider, "_api", None)
    monkeypatch.setattr(provider, "_cached", None)
    window.delay(key="noapi", n=2)
    tasks_ota.RAN.clear()
    clock(seconds=11)
    burst()
    assert tasks_ota.RAN == [1]
    job = Job.objects.get()
    assert job.status == Job.Status.SUCCESSFUL and job.enqueue_count == 2
    assert job.trace_links == stored  # an untraced slide leaves the carried links alone
    assert otel_spans.get_finished_spans() == ()
