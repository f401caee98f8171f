"""The database collector: its gauges equal counts taken from the rows, read through indexes (issue #11)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client import CollectorRegistry

from django_debounce.contrib.prometheus.collector import (
    DatabaseCollector,
    breaker_query,
    ready_query,
    running_query,
)
from django_debounce.models import Job, TaskState
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

READY, RUNNING = Job.Status.READY, Job.Status.RUNNING


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(DatabaseCollector())
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def seed() -> None:
    """A mix of queues, tasks and states, some due and some not, open windows and history."""
    now = T
    for i in range(7):  # due, plain
        JobFactory(task_name="c.a", queue="q1", run_at=now - timedelta(seconds=10 * i))
    for i in range(3):  # not yet due, open windows
        JobFactory(
            task_name="c.a",
            queue="q1",
            run_at=now + timedelta(seconds=5),
            opened_at=now,
            max_run_at=now + timedelta(minutes=1),
            window_key=f"w{i}",
            key_hash=f"w{i}",
        )
    JobFactory(  # an open window already due and unclaimed (still open, §4.1)
        task_name="c.b",
        queue="q2",
        run_at=now - timedelta(seconds=90),
        opened_at=now - timedelta(seconds=100),
        max_run_at=now + timedelta(minutes=1),
        window_key="w-due",
        key_hash="w-due",
    )
    for _ in range(4):
        JobFactory(
            task_name="c.b",
            queue="q2",
            status=RUNNING,
            attempts=1,
            worker_id="w",
            started_at=now,
            lease_expires_at=now + timedelta(minutes=1),
        )
    for status in (Job.Status.SUCCESSFUL, Job.Status.FAILED, Job.Status.SHED):
        for _ in range(5):
            JobFactory(task_name="c.a", queue="q1", status=status, finished_at=now)
    TaskState.objects.create(task_name="c.a", breaker_state=TaskState.BreakerState.OPEN)
    TaskState.objects.create(task_name="c.b", breaker_state=TaskState.BreakerState.HALF_OPEN)
    TaskState.objects.create(task_name="c.c")


def test_gauges_equal_counts_taken_from_the_rows(clock):
    clock()
    seed()
    got = scrape()
    now = timezone.now()
    jobs = list(Job.objects.filter(task_name__startswith="c."))
    for queue, task in (("q1", "c.a"), ("q2", "c.b")):
        labels = (("queue", queue), ("task_name", task))
        mine = [job for job in jobs if (job.queue, job.task_name) == (queue, task)]
        ready = [job for job in mine if job.status == READY]
        due = [job for job in ready if job.run_at <= now]
        expected = {
            "django_debounce_ready_jobs": len(ready),
            "django_debounce_due_jobs": len(due),
            "django_debounce_running_jobs": sum(job.status == RUNNING for job in mine),
            "django_debounce_open_windows": sum(job.is_open_window for job in mine),
            "django_debounce_oldest_due_age_seconds": max(
                ((now - job.run_at).total_seconds() for job in due), default=0
            ),
        }
        assert {name: got[(name, labels)] for name in expected} == expected
    # The seeded values themselves, so the comparison above cannot pass on empty rows.
    q1 = (("queue", "q1"), ("task_name", "c.a"))
    q2 = (("queue", "q2"), ("task_name", "c.b"))
    assert got[("django_debounce_ready_jobs", q1)] == 10
    assert got[("django_debounce_due_jobs", q1)] == 7
    assert got[("django_debounce_open_windows", q1)] == 3
    assert got[("django_debounce_oldest_due_age_seconds", q1)] == 60
    assert got[("django_debounce_oldest_due_age_seconds", q2)] == 90
    assert got[("django_debounce_running_jobs", q2)] == 4
    assert got[("django_debounce_open_windows", q2)] == 1
    breakers = {
        task: got[("django_debounce_circuit_breaker_open", (("task_name", task),))]
        for task in ("c.a", "c.b", "c.c")
    }
    assert breakers == {"c.a": 1, "c.b": 1, "c.c": 0}
    assert got[("django_debounce_collector_up", ())] == 1


def test_a_registered_task_with_no_live_job_reads_zero(clock):
    got = scrape()
    labels = (("queue", "metrics"), ("task_name", "met.plain"))
    assert got[("django_debounce_ready_jobs", labels)] == 0
    assert got[("django_debounce_oldest_due_age_seconds", labels)] == 0


def test_a_database_error_answers_collector_up_zero(monkeypatch):
    from django.db import DatabaseError

    from django_debounce.contrib.prometheus import collector as metrics_collector

    def refuse(*args: object) -> None:
        raise DatabaseError("refused")

    monkeypatch.setattr(metrics_collector, "ready_query", refuse)
    assert scrape() == {("django_debounce_collector_up", ()): 0}


@pytest.mark.postgres
def test_the_queries_never_read_the_finished_history():
    """EXPLAIN on PostgreSQL: with 200,000 finished jobs the live-row queries use the indexes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Job._meta.db_table} (task_name, queue, priority, status, args, kwargs, "
            "run_at, enqueue_count, last_enqueued_at, attempts, max_retries, error, traceback, "
            "metadata, notes, created_at, finished_at, worker_id) "
            "SELECT 'h.old', 'q' || (i % 5), 0, 'SUCCESSFUL', '[]', '{}', now(), 1, now(), 1, 0, "
            "'', '', '{}', '', now(), now(), '' FROM generate_series(1, 200000) AS i"
        )
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    for i in range(20):
        JobFactory(task_name="h.live", queue="q1", run_at=timezone.now() - timedelta(seconds=i))
    plans = {
        "ready": ready_query(timezone.now(), "default").explain(),
        "running": running_query("default").explain(),
    }
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, f"{name} reads the whole table:\n{plan}"
        assert "debounce_job_" in plan, f"{name} uses no job index:\n{plan}"
    # TaskState holds one row per gated task: a scan of it is bounded by the tasks.
    assert "task_name" in str(breaker_query("default").query)
