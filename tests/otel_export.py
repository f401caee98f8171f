"""Spans of a test's subprocesses, written where the test reads them (decision 213's process test).

``DEBOUNCE_TEST_OTEL_SPANS=DIR`` in a subprocess's environment makes
tests/settings.py call :func:`install`: the process sets the global tracer
provider (once, as a project would in its settings or a Celery signal) with a
``SimpleSpanProcessor`` that appends each finished span as one JSON line to
``DIR/spans-<pid>.jsonl``. Without the variable nothing is imported or set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """Return what a test reads of ``span``: name, kind, ids (hex), links, attributes."""
    context = span.get_span_context()
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


class JsonLinesExporter(SpanExporter):
    """Append each span as one JSON line to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(span_record(span), default=list) + "\n")
        return SpanExportResult.SUCCESS


def install(directory: str) -> None:
    """Set the global provider of this process, exporting to ``directory/spans-<pid>.jsonl``."""
    provider = TracerProvider()
    path = Path(directory) / f"spans-{os.getpid()}.jsonl"
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Return every span the subprocesses wrote under ``directory``, file by file."""
    found = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            found.append({**json.loads(line), "file": path.name})
    return found
