"""Concurrent traced slides of one window (PostgreSQL's upsert, MariaDB's locked slide).

Threads of this process, each with its own connection and its own request span, call one
window at once. Every call is traced, so no call's count is lost: the row's ``calls`` is
its ``enqueue_count``, its links the first call's and the latest, at most ``MAX_LINKS``,
each an enqueue span that was exported; no deadlock or raw database error escapes.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from opentelemetry.trace import SpanKind

from django_debounce.models import Job
from django_debounce.tracing import MAX_LINKS
from tests.testapp.tasks_ota import window

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

THREADS = 6
CALLS = 40


def test_racing_traced_slides_lose_no_count_and_keep_the_bound(otel_spans):
    tracer = otel_spans.provider.get_tracer("tests")
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def call(t: int) -> None:
        try:
            start.wait()
            for n in range(CALLS):
                with tracer.start_as_current_span(f"request {t}/{n}"):
                    window.delay(key="race", n=n)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    (job,) = Job.objects.filter(task_name="ota.window")
    assert job.enqueue_count == THREADS * CALLS
    assert job.trace_links["calls"] == THREADS * CALLS
    links = job.trace_links["links"]
    assert len(links) == MAX_LINKS
    assert len({link["traceparent"] for link in links}) == MAX_LINKS
    enqueues = [s for s in otel_spans.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert len(enqueues) == THREADS * CALLS
    created = [s for s in enqueues if s.attributes["debounce.outcome"] == "created"]
    assert len(created) == 1
    exported = {f"{s.context.span_id:016x}" for s in enqueues}
    assert {link["traceparent"].split("-")[2] for link in links} <= exported
    assert links[0]["traceparent"].split("-")[2] == f"{created[0].context.span_id:016x}"
