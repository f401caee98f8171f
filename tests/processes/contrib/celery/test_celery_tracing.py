"""A debounced job's run links to the calls that joined it, through a real Celery worker too.

Issue #22 item 5's "done when": three calls of ``otl.quick`` (a 1 s window), each in a
span of its own trace in this test process, become one job; the process that runs it, a
``celery worker`` fed by ``run_debounce_worker --dispatch-only`` or the built-in
``run_debounce_worker``, exports its spans as JSON lines (tests/otel_export.py, switched
on by ``DEBOUNCE_TEST_OTEL_SPANS`` in tests/settings.py). Its run span must link
to exactly the three enqueue spans, and the claim that took the job is a span too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

from django_debounce.models import Job
from tests.otel_export import read_spans
from tests.processes.celery_rig import CeleryRig
from tests.procs import Processes, processes, wait_for
from tests.testapp.tasks_tracing import quick

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(120),
]


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with processes(tmp_path, {}) as group:
        yield group


@pytest.mark.parametrize("executor", ["worker", "celery"])
def test_the_run_span_links_to_every_call_that_joined_the_window(
    executor: str, procs: Processes, settings: Any, tmp_path, otel_spans
) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    rig = CeleryRig(
        "redis", procs, DEBOUNCE_TEST_EXECUTOR=executor, DEBOUNCE_TEST_OTEL_SPANS=str(spans_dir)
    )
    for name, value in rig.settings().items():
        setattr(settings, name, value)
    settings.DEBOUNCE_EXECUTOR = executor
    try:
        if executor == "celery":
            rig.worker()
            rig.dispatcher("--poll-interval", "0.1")
        else:
            procs.worker("--poll-interval", "0.1", env=rig.env)
        tracer = otel_spans.provider.get_tracer("tests")
        parents = []
        for n in range(3):
            with tracer.start_as_current_span(f"request {n}") as parent:
                job = quick.delay(key="k", n=n)
            parents.append(parent.get_span_context())
        assert job.enqueue_count == 3
        enqueues = [s for s in otel_spans.get_finished_spans() if s.kind == SpanKind.PRODUCER]
        assert [s.attributes["debounce.outcome"] for s in enqueues] == [
            "created",
            "debounced",
            "debounced",
        ]

        def ran() -> list[dict[str, Any]]:
            return [s for s in read_spans(spans_dir) if s["kind"] == "CONSUMER"]

        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL and ran(),
            timeout=60,
            what=lambda: f"job {job.pk} to run\n{procs.tails()}",
        )
        (run,) = ran()
        assert run["name"] == "run otl.quick"
        assert run["attributes"]["debounce.outcome"] == "succeeded"
        assert run["attributes"]["messaging.message.id"] == str(job.pk)
        assert run["links"] == [
            {"trace_id": f"{p.trace_id:032x}", "span_id": f"{s.context.span_id:016x}"}
            for p, s in zip(parents, enqueues, strict=True)
        ]
        claims = [s for s in read_spans(spans_dir) if s["name"] == "claim"]
        assert [c["attributes"]["debounce.executor"] for c in claims] == [executor]
        assert claims[0]["attributes"]["messaging.batch.message_count"] == 1
        if executor == "celery":  # the claim is the dispatcher's, the run the Celery worker's
            assert claims[0]["file"] != run["file"]
    finally:
        rig.close()
