"""Queue depth read from the database at scrape time (issue #11 item 1, contract §9).

:class:`DatabaseCollector` is a prometheus_client collector: each scrape runs
three queries and reports what they found as gauges. Every query reads only
live rows: the job queries filter on ``status`` (READY, RUNNING), which leads
the claim index (``debounce_job_claim``) and the lease index
(``debounce_job_status_lease``), so the finished history, the part of the
table that grows forever, is never read; the third reads ``TaskState``, one
row per task with flow control. A scrape's cost follows the backlog, not the
table (decision 107; ``tests/db/contrib/prometheus/test_metrics_collector.py`` checks the plans
with ``EXPLAIN`` on PostgreSQL).

Gauges (labels ``queue`` and ``task_name``; a breaker's ``task_name`` only):

* ``django_debounce_ready_jobs``: READY jobs (due or not, open windows included);
* ``django_debounce_due_jobs``: READY jobs whose ``run_at`` has come (§11);
* ``django_debounce_running_jobs``: RUNNING jobs (claimed, lease live or not);
* ``django_debounce_open_windows``: debounce windows still taking calls (§4.1);
* ``django_debounce_oldest_due_age_seconds``: now − the oldest due job's
  ``run_at`` (0 when nothing is due): the queue latency to alert on;
* ``django_debounce_circuit_breaker_open``: 1 while a task's breaker is open
  or half-open (probing), 0 when closed (§6);
* ``django_debounce_collector_up``: 1 when the queries ran, 0 when the
  database refused them (the error is logged; the scrape still answers).

Every registered task reports its default queue with zeros when it has no
live job, so a series reads 0 instead of vanishing when a backlog drains.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ... import registry
from ...models import Job, TaskState

logger = logging.getLogger("django_debounce.metrics")

LABELS = ["queue", "task_name"]

_JOB_GAUGES = {
    "ready": ("django_debounce_ready_jobs", "READY jobs (waiting to be claimed)."),
    "due": ("django_debounce_due_jobs", "READY jobs whose run_at has come."),
    "running": ("django_debounce_running_jobs", "RUNNING jobs (claimed by a worker)."),
    "windows": ("django_debounce_open_windows", "Debounce windows still taking calls."),
    "oldest": (
        "django_debounce_oldest_due_age_seconds",
        "Seconds since the run_at of the oldest due job (0: none due).",
    ),
}


_MIGRATE_HINT = " (the package's tables are missing: run python manage.py migrate)"


def _names_our_table(exc: DatabaseError) -> bool:
    """Whether the driver's error names one of our tables (SQLite's "no such table: …",
    PostgreSQL's "relation … does not exist", MariaDB's "Table '…' doesn't exist")."""
    text = str(exc)
    return any(table in text for table in (Job._meta.db_table, TaskState._meta.db_table))


class DatabaseCollector(Collector):
    """Report READY, due and RUNNING jobs, open windows, queue latency and open breakers.

    Args:
        using: database alias to read (default ``"default"``).
        close_connections: close this thread's database connections after each
            scrape. True for an HTTP server that answers each scrape in a new
            thread (the worker's ``--metrics-port``): a thread's connection
            would otherwise stay open until the server stops. False inside a
            Django request, which closes its connection itself.
    """

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS, close_connections: bool = False) -> None:
        self.using = using
        self.close_connections = close_connections

    def describe(self) -> Iterable[Metric]:
        """Return the families without samples: registering this collector runs no query."""
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        """Run the queries (three) and return the gauges; never raises for a database error."""
        families = self._families()
        try:
            self._fill(families)
            families["up"].add_metric([], 1)
        except DatabaseError as exc:
            logger.warning(
                "metrics: the database refused the queue-depth queries: %s%s",
                exc,
                _MIGRATE_HINT if _names_our_table(exc) else "",
                extra={"action": "metrics_error"},
            )
            families = {"up": self._families()["up"]}
            families["up"].add_metric([], 0)
        finally:
            if self.close_connections:
                connections.close_all()
        return list(families.values())

    def _families(self) -> dict[str, GaugeMetricFamily]:
        families = {
            key: GaugeMetricFamily(name, doc, labels=LABELS)
            for key, (name, doc) in _JOB_GAUGES.items()
        }
        families["breakers"] = GaugeMetricFamily(
            "django_debounce_circuit_breaker_open",
            "1 while the task's circuit breaker is open or half-open, else 0.",
            labels=["task_name"],
        )
        families["up"] = GaugeMetricFamily(
            "django_debounce_collector_up",
            "1 when the queue-depth queries ran at this scrape, 0 when the database refused them.",
        )
        return families

    def _fill(self, families: dict[str, GaugeMetricFamily]) -> None:
        now = timezone.now()
        rows: dict[tuple[str, str], dict[str, float]] = {}
        for name, task in registry.all_tasks().items():
            rows[(task.options.queue, name)] = {}
        for row in ready_query(now, self.using):
            oldest = row.pop("oldest")
            if oldest is not None:
                row["oldest"] = max(0.0, (now - oldest).total_seconds())
            rows[(row.pop("queue"), row.pop("task_name"))] = row
        for queue, task_name, running in running_query(self.using):
            rows.setdefault((queue, task_name), {})["running"] = running
        for (queue, task_name), values in sorted(rows.items()):
            for key in _JOB_GAUGES:
                families[key].add_metric([queue, task_name], values.get(key, 0))
        for task_name, state in sorted(breaker_query(self.using)):
            open_now = state != TaskState.BreakerState.CLOSED
            families["breakers"].add_metric([task_name], 1 if open_now else 0)


def ready_query(now: Any, using: str) -> QuerySet[Any, Any]:
    """One row per (queue, task) with READY jobs: counts, open windows, oldest due ``run_at``."""
    due = Q(run_at__lte=now)
    return (
        Job.objects.using(using)
        .ready()
        .values("queue", "task_name")
        .annotate(
            ready=Count("pk"),
            due=Count("pk", filter=due),
            windows=Count("pk", filter=Q(window_key__isnull=False)),
            oldest=Min("run_at", filter=due),
        )
        .order_by()
    )


def running_query(using: str) -> QuerySet[Job, tuple[str, str, int]]:
    """(queue, task, RUNNING jobs) for each pair with a job in flight."""
    return (
        Job.objects.using(using)
        .running()
        .values("queue", "task_name")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("queue", "task_name", "n")
    )


def breaker_query(using: str) -> QuerySet[TaskState, tuple[str, str]]:
    """(task, breaker state) of every task with flow-control state (one row per gated task)."""
    return TaskState.objects.using(using).order_by().values_list("task_name", "breaker_state")


__all__ = ["DatabaseCollector", "breaker_query", "ready_query", "running_query"]
