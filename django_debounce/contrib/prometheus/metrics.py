"""Prometheus metrics of django_debounce (issue #11 item 1, contract §9; docs/howto/metrics.md).

The package's core never imports prometheus_client: this edge module counts
what the core's Django signals report (:mod:`django_debounce.signals`), and
:class:`~django_debounce.contrib.prometheus.collector.DatabaseCollector` reads queue
depth from the database at scrape time. ``DjangoDebounceConfig.ready``
connects the receivers (:func:`install`) when prometheus_client imports and
``DEBOUNCE_METRICS`` is not False.

Counters and histograms, each labelled ``queue`` and ``task_name`` (never a
key or a job id); where a metric counts a closed vocabulary one more label
names the value (``status``, ``kind``, ``edge``; decisions 105, 197):

============================================== ===================================================
``django_debounce_created_total``              calls that opened a new job (``outcome="created"``)
``django_debounce_debounced_total``            calls collapsed into an open window (§9)
``django_debounce_coalesced_total``            calls that returned a pending job by its unique key
``django_debounce_runs_started_total``         attempts started (``job_started``)
``django_debounce_forced_runs_total``          first runs of windows forced by the max wait
``django_debounce_edge_runs_total``            first runs of windows by ``edge`` (leading, trailing)
``django_debounce_debounce_delay_seconds``     window opened → run started, first attempt (§9)
``django_debounce_jobs_finished_total``        jobs ended, by ``status`` (SUCCESSFUL, FAILED, SHED)
``django_debounce_attempt_duration_seconds``   one attempt, started → outcome recorded
``django_debounce_retries_total``              failed attempts put back READY for a retry
``django_debounce_dead_letters_total``         dead letters by ``kind`` (failure, shed, codel, …)
============================================== ===================================================

Counts are per process: the process that enqueues counts the calls, the
worker counts the runs. With ``PROMETHEUS_MULTIPROC_DIR`` set, every process
of the host writes its counts there and any exporter of the host (the
worker's ``--metrics-port``, ``celery worker --debounce-metrics-port`` of
:mod:`django_debounce.contrib.celery.metrics`, :func:`~django_debounce.metrics_views.metrics_view`)
serves their sum (:func:`exposition_registry`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ... import signals
from ...conf import settings
from ...dead_letter_kinds import DeadLetterKind
from ...models import DeadLetter, Job
from ...ops import edge_runs
from .collector import DatabaseCollector

LABELS = ("queue", "task_name")


@dataclass(frozen=True)
class Metrics:
    """The process's metric objects (created once, in prometheus_client's default registry)."""

    created: Counter
    debounced: Counter
    coalesced: Counter
    started: Counter
    forced: Counter
    edge_runs: Counter
    delay: Histogram
    finished: Counter
    duration: Histogram
    retries: Counter
    dead_letters: Counter


_metrics: Metrics | None = None


def get_metrics() -> Metrics:
    """Return the process's metrics, creating them at the first call.

    The histograms' buckets are read from ``DEBOUNCE_METRICS_DELAY_BUCKETS``
    and ``DEBOUNCE_METRICS_DURATION_BUCKETS`` then; a later change of those
    settings needs a restart (a metric's buckets cannot change while it lives).

    Raises:
        ConfigurationError: a bucket setting is malformed (check E041).
    """
    global _metrics
    if _metrics is None:
        labels = list(LABELS)
        _metrics = Metrics(
            created=Counter(
                "django_debounce_created",
                "Enqueue calls that created a new job.",
                labels,
            ),
            debounced=Counter(
                "django_debounce_debounced",
                "Enqueue calls collapsed into an open debounce window.",
                labels,
            ),
            coalesced=Counter(
                "django_debounce_coalesced",
                "Enqueue calls that returned the pending job holding their unique key.",
                labels,
            ),
            started=Counter("django_debounce_runs_started", "Attempts started.", labels),
            forced=Counter(
                "django_debounce_forced_runs",
                "First runs of debounce windows that the max wait forced (calls kept coming).",
                labels,
            ),
            edge_runs=Counter(
                "django_debounce_edge_runs",
                "First runs of debounce windows, by their run of the burst (leading, trailing).",
                [*labels, "edge"],
            ),
            delay=Histogram(
                "django_debounce_debounce_delay_seconds",
                "Seconds from a debounce window opening to its first run starting.",
                labels,
                buckets=settings.metrics_delay_buckets,
            ),
            finished=Counter(
                "django_debounce_jobs_finished",
                "Jobs that ended, by final status.",
                [*labels, "status"],
            ),
            duration=Histogram(
                "django_debounce_attempt_duration_seconds",
                "Seconds from an attempt starting to its outcome being recorded.",
                labels,
                buckets=settings.metrics_duration_buckets,
            ),
            retries=Counter(
                "django_debounce_retries",
                "Failed attempts put back READY for a retry.",
                labels,
            ),
            dead_letters=Counter(
                "django_debounce_dead_letters",
                "Dead letters written, by kind (failure, shed, codel, unknown_task, other).",
                [*labels, "kind"],
            ),
        )
    return _metrics


def _on() -> bool:
    """True while metrics are wanted (``DEBOUNCE_METRICS`` may be switched off by a test)."""
    return settings.metrics is not False


def on_enqueued(sender: Any, job: Job, outcome: str, **kwargs: Any) -> None:
    """Count one enqueue call by its outcome (``job_enqueued``)."""
    if not _on():
        return
    metrics = get_metrics()
    counter = {"created": metrics.created, "debounced": metrics.debounced}.get(
        outcome, metrics.coalesced
    )
    counter.labels(job.queue, job.task_name).inc()


def on_started(sender: Any, job: Job, **kwargs: Any) -> None:
    """Count an attempt; for a window's first run, its delay, whether the max wait forced
    it and which run of its burst it is (one query for a leading or both task)."""
    if not _on():
        return
    metrics = get_metrics()
    labels = (job.queue, job.task_name)
    metrics.started.labels(*labels).inc()
    if job.opened_at is None or job.attempts != 1:
        return  # not debounced, or a retry: the window's delay was observed at its first run
    started = job.started_at or timezone.now()
    metrics.delay.labels(*labels).observe(max(0.0, (started - job.opened_at).total_seconds()))
    if job.run_reason == "max_wait":
        metrics.forced.labels(*labels).inc()
    edge = edge_runs.run_edge(job)
    if edge is not None:  # leading or trailing: two values (decision 197)
        metrics.edge_runs.labels(*labels, edge).inc()


def on_finished(sender: Any, job: Job, status: str, **kwargs: Any) -> None:
    """Count a run's end: its duration, and a retry or the job's final status (``job_finished``)."""
    if not _on():
        return
    metrics = get_metrics()
    labels = (job.queue, job.task_name)
    if job.started_at is not None:
        ended = job.finished_at or timezone.now()
        metrics.duration.labels(*labels).observe(max(0.0, (ended - job.started_at).total_seconds()))
    if status == Job.Status.READY:
        metrics.retries.labels(*labels).inc()
    else:
        metrics.finished.labels(*labels, status).inc()


def on_dead_lettered(sender: Any, job: Job, dead_letter: DeadLetter, **kwargs: Any) -> None:
    """Count a dead letter by kind (``job_dead_lettered``; a lapsed lease's too)."""
    if not _on():
        return
    kind = dead_letter.kind or DeadLetterKind.of_reason(dead_letter.reason)
    get_metrics().dead_letters.labels(dead_letter.queue, dead_letter.task_name, kind).inc()


def on_shed(sender: Any, job: Job, dead_letter: DeadLetter, **kwargs: Any) -> None:
    """Count a shed: a SHED job and its dead letter (``shed`` or ``codel``; ``_job_shed``)."""
    if not _on():
        return
    metrics = get_metrics()
    metrics.finished.labels(job.queue, job.task_name, Job.Status.SHED).inc()
    metrics.dead_letters.labels(job.queue, job.task_name, dead_letter.kind).inc()


_RECEIVERS = (
    (signals.job_enqueued, on_enqueued),
    (signals.job_started, on_started),
    (signals.job_finished, on_finished),
    (signals.job_dead_lettered, on_dead_lettered),
    (signals._job_shed, on_shed),
)


def install() -> None:
    """Create the metrics and connect their receivers to the package's signals (idempotent).

    Called by ``DjangoDebounceConfig.ready`` when prometheus_client imports
    and ``DEBOUNCE_METRICS`` is not False.
    """
    get_metrics()
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, dispatch_uid=f"django_debounce.metrics.{receiver.__name__}")


def uninstall() -> None:
    """Disconnect the receivers (the metric objects stay; their counts stop moving)."""
    for signal, receiver in _RECEIVERS:
        signal.disconnect(dispatch_uid=f"django_debounce.metrics.{receiver.__name__}")


class _DefaultRegistry(Collector):
    """Forward prometheus_client's default registry (this process's metrics) into another."""

    def collect(self) -> Any:
        return REGISTRY.collect()

    def describe(self) -> list[Metric]:
        return []


def multiprocess_dir() -> str | None:
    """Return ``PROMETHEUS_MULTIPROC_DIR`` when set: then counts are summed over the host."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition_registry(*, close_connections: bool = False) -> CollectorRegistry:
    """Return a registry holding what an exporter serves: the counts and the database gauges.

    Without ``PROMETHEUS_MULTIPROC_DIR``: this process's default registry
    (the package's counters, and whatever else the project registered there,
    e.g. the process and GC collectors). With it: the sum over every process
    of the host that wrote to that directory
    (``prometheus_client.multiprocess.MultiProcessCollector``). Either way
    the :class:`~django_debounce.contrib.prometheus.collector.DatabaseCollector` gauges
    are added, read at each scrape.

    Args:
        close_connections: passed to the database collector (True for an
            HTTP server that answers each scrape in a new thread).
    """
    registry = CollectorRegistry()
    if multiprocess_dir():
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_DefaultRegistry())
    registry.register(DatabaseCollector(close_connections=close_connections))
    return registry


def serve(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve :func:`exposition_registry` over HTTP on ``addr:port`` from a daemon thread.

    What ``run_debounce_worker --metrics-port`` calls. Any path answers with
    the text format (``/metrics`` by convention).

    Returns:
        The HTTP server (call ``shutdown()`` to stop it).

    Raises:
        OSError: the address is taken or cannot be bound.
    """
    server, _thread = start_http_server(
        port, addr=addr, registry=exposition_registry(close_connections=True)
    )
    return server


__all__ = [
    "Metrics",
    "exposition_registry",
    "get_metrics",
    "install",
    "multiprocess_dir",
    "serve",
    "uninstall",
]
