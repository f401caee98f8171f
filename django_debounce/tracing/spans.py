"""The spans of an enqueue, a claim and a run (docs/howto/opentelemetry.md, decisions 211-213).

Called only while tracing is on (:func:`~django_debounce.tracing.provider.tracer`
returned a tracer), so this module imports OpenTelemetry at its top: the hot
paths import it lazily, on their traced branch.

* **enqueue** (``PRODUCER``): one per call, a child of the caller's current
  span; its W3C trace context is what the job carries
  (:mod:`~django_debounce.tracing.carriers`).
* **claim** (``CLIENT``): one per claim that took at least one job (an idle
  poll leaves no span: the span is made after the claim, with the claim's start
  as its start time).
* **run** (``CONSUMER``): one per run of a job's task, linked to every carried
  enqueue (a debounced job has many producers: span links, not one parent),
  and current while the task runs, so the task's own spans are its children.

Attribute names follow OpenTelemetry's messaging conventions where one fits
(``messaging.system`` is ``django_debounce``, ``messaging.destination.name``
the queue, ``messaging.message.id`` the job id); the rest are ``debounce.*``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..exceptions import JobTimeout
from .carriers import links_of, opening

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from ..models import Job
    from ..plans import Plan

SYSTEM = "django_debounce"
#: The carrier's format is W3C trace context whatever ``OTEL_PROPAGATORS`` says: the
#: carrier is django_debounce's own storage, read by its own workers (decision 212).
_W3C = TraceContextTextMapPropagator()

logger = logging.getLogger(__name__)
#: The kinds of tracing error already logged with their traceback (later ones: one line).
_logged: set[str] = set()


def broke(where: str, exc: BaseException) -> None:
    """Log that tracing failed at ``where`` with ``exc``; the traced operation carries on (decision 227).

    The SDK (a span processor, a sampler, an exporter called synchronously) may
    raise: a trace is an observer and must not fail the enqueue, claim or run
    it watches. The first error of each kind is logged with its traceback.
    """
    kind = f"{where}:{type(exc).__qualname__}"
    logger.warning(
        "tracing failed (%s), carrying on untraced: %r", where, exc, exc_info=kind not in _logged
    )
    _logged.add(kind)


def _span_or_none(where: str, start: Callable[[], Span]) -> Span | None:
    try:
        return start()
    except Exception as exc:
        broke(where, exc)
        return None


def _quietly(where: str, action: Callable[..., object], *args: object) -> None:
    try:
        action(*args)
    except Exception as exc:
        broke(where, exc)


def _error(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute("error.type", f"{type(exc).__module__}.{type(exc).__qualname__}")
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))


def traced_enqueue(tracer: Tracer, plan: Plan, write: Callable[[], Job]) -> Job:
    """Write ``plan`` with ``write()`` inside its enqueue span; the job carries the span's context.

    ``plan.trace_links`` is set before the write when the span is sampled (an
    unsampled span would be a link to nothing). A write that raises ends the
    span with the error.
    """
    span = _span_or_none(
        "enqueue",
        lambda: tracer.start_span(
            f"enqueue {plan.task_name}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "enqueue",
                "messaging.destination.name": plan.queue,
                "debounce.task": plan.task_name,
            },
        ),
    )
    if span is None:
        return write()
    with _Current(span):
        _quietly("enqueue", _carry, span, [plan])
        try:
            job = write()
        except BaseException as exc:
            _quietly("enqueue", _error, span, exc)
            raise
        attributes: dict[str, Any] = {
            "messaging.message.id": str(job.pk),
            "debounce.outcome": job.outcome,
            "debounce.enqueue_count": job.enqueue_count,
        }
        key_hash = plan.window_key or plan.unique_lock
        if key_hash:  # the key's hash, never its text: keys may hold user data
            attributes["debounce.key_hash"] = key_hash
        _quietly("enqueue", span.set_attributes, attributes)
    return job


class _Current:
    """Make ``span`` current for the block, then end it; an SDK error in ending it is logged."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.token: object = None

    def __enter__(self) -> None:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self.token)  # type: ignore[arg-type]
        _quietly("end", self.span.end)


def _carry(span: Span, plans: Sequence[Plan]) -> None:
    """Give ``plans`` the context of ``span`` (current) to carry, when it is sampled."""
    if span.get_span_context().trace_flags.sampled:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        for plan in plans:
            plan.trace_links = opening(carrier) if carrier else None


def traced_enqueue_many(
    tracer: Tracer, plans: Sequence[Plan], write: Callable[[], list[Job]]
) -> list[Job]:
    """Write a bulk enqueue's ``plans`` with ``write()`` inside one span; each job carries it.

    One ``PRODUCER`` span for the batch (``messaging.batch.message_count``
    calls); a window that several of its calls joined gets one link, the
    batch's. The span counts the calls' outcomes (``debounce.created`` …).
    """
    span = _span_or_none(
        "enqueue_many",
        lambda: tracer.start_span(
            "enqueue_many",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "enqueue_many",
                "messaging.batch.message_count": len(plans),
                "debounce.tasks": sorted({plan.task_name for plan in plans}),
            },
        ),
    )
    if span is None:
        return write()
    with _Current(span):
        _quietly("enqueue_many", _carry, span, plans)
        try:
            jobs = write()
        except BaseException as exc:
            _quietly("enqueue_many", _error, span, exc)
            raise
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.outcome] = counts.get(job.outcome, 0) + 1
        _quietly(
            "enqueue_many",
            span.set_attributes,
            {f"debounce.{outcome}": n for outcome, n in counts.items()},
        )
    return jobs


def record_claim(
    tracer: Tracer, began: int, jobs: Sequence[Job], queues: Sequence[str] | None, executor: str
) -> None:
    """Record a claim that took ``jobs`` (none: no span) as a span from ``began`` to now."""
    if not jobs:
        return
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "claim",
        "messaging.batch.message_count": len(jobs),
        "debounce.executor": executor,
        "debounce.queues": sorted({job.queue for job in jobs}),
    }
    if queues and len(queues) == 1:
        attributes["messaging.destination.name"] = queues[0]
    try:
        span = tracer.start_span(
            "claim", kind=SpanKind.CLIENT, attributes=attributes, start_time=began
        )
        span.end()
    except Exception as exc:
        broke("claim", exc)


def _links(job: Job) -> tuple[list[Link], int]:
    """Return the links of ``job``'s carried enqueues and how many calls were left out."""
    carriers, left_out = links_of(job.trace_links)
    links = []
    for carrier in carriers:
        found = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
        if found.is_valid:
            links.append(Link(found))
    return links, left_out


class RunSpan:
    """The span of one run of a job's task, current while the task runs (a context manager).

    :func:`~django_debounce.run.execution.run_job` tells it what happened
    (:meth:`returned`, :meth:`raised`); on exit it names the outcome from that
    and the job's status: ``succeeded``, ``retried``, ``dead_lettered``,
    ``cancelled``, ``expired`` (claimed, it reached its executor past its
    expiry and never ran), ``put_back`` (a task not known here yet), ``discarded`` (a
    late run whose job was reclaimed), or ``not_recorded`` (the run ended
    with an error escaping ``run_job``: an outage, the process stopping).
    """

    def __init__(self, tracer: Tracer, job: Job) -> None:
        self.job = job
        links, left_out = _links(job)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "run",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.pk),
            "debounce.task": job.task_name,
            "debounce.attempt": job.attempts,
            "debounce.enqueue_count": job.enqueue_count,
            "debounce.links": len(links),
        }
        if left_out:
            attributes["debounce.links_left_out"] = left_out
        self.span = tracer.start_span(
            f"run {job.task_name}", kind=SpanKind.CONSUMER, links=links, attributes=attributes
        )
        self._ran: bool | None = None
        self._token: object = None

    def __enter__(self) -> RunSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def returned(self) -> None:
        """The task returned."""
        self._ran = True

    def raised(self, exc: BaseException) -> None:
        """The task raised ``exc``: record it on the span (its outcome is written next)."""
        self._ran = False
        _quietly("run", self._raised, exc)

    def _raised(self, exc: BaseException) -> None:
        _error(self.span, exc)
        if isinstance(exc, JobTimeout):
            self.span.set_attribute("debounce.timed_out", True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]
        _quietly("run", self._end, exc)

    def _end(self, exc: BaseException | None) -> None:
        if exc is not None:
            outcome = "not_recorded"
            _error(self.span, exc)
        else:
            outcome = self._outcome()
        self.span.set_attribute("debounce.outcome", outcome)
        self.span.end()

    def _outcome(self) -> str:
        status = self.job.status
        if self._ran:  # its result may still be refused for good: then it is a dead letter
            return "dead_lettered" if status == "FAILED" else "succeeded"
        return {
            "READY": "put_back" if self._ran is None else "retried",
            "FAILED": "dead_lettered",
            "CANCELLED": "cancelled",
            "SUCCESSFUL": "succeeded",
            "EXPIRED": "expired",
        }.get(status, "discarded")


def record_expired(tracer: Tracer, job: Job) -> None:
    """Record that the claimed ``job`` reached its executor past its expiry and never ran.

    A run span of no length, linked as a run's would be, with the outcome ``expired``.
    """
    span = run_span(tracer, job)
    if span is not None:
        with span:
            pass  # the job's status (EXPIRED) names the outcome


def run_span(tracer: Tracer, job: Job) -> RunSpan | None:
    """Return a :class:`RunSpan` of ``job``, or ``None`` when the SDK raised making it (logged)."""
    try:
        return RunSpan(tracer, job)
    except Exception as exc:
        broke("run", exc)
        return None
