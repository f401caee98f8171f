"""OpenTelemetry traces of enqueues, claims and runs (the ``otel`` extra; docs/howto/opentelemetry.md).

On when ``opentelemetry-api`` is installed and a tracer provider is set
(:func:`tracer`); off, it costs the hot paths a check and writes nothing.
:func:`use_tracer_provider` gives django_debounce a provider of its own. The
spans are ``tracing/spans.py``'s (which alone imports OpenTelemetry), the
bounded links a job carries ``tracing/carriers.py``'s.
"""

from __future__ import annotations

from .carriers import MAX_LINKS
from .provider import expired_unrun, tracer, use_tracer_provider

__all__ = ["MAX_LINKS", "expired_unrun", "tracer", "use_tracer_provider"]
