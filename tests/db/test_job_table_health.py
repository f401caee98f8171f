"""Migration 0013 on PostgreSQL: per-table autovacuum and a claim index of READY rows (decisions 219, 220).

What the migration sets is read back from the catalog (``pg_class.reloptions``,
``pg_index``); that the claim and the metrics still use the partial index is read
from the plans of their real statements; going back to 0012 restores the full index
and the server's autovacuum defaults, and forward again the partial one. The figures
the settings buy are ``bench/table_health.py``'s (docs/howto/table-health.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import Job

pytestmark = pytest.mark.postgres

TABLE = Job._meta.db_table
BEFORE = [("django_debounce", "0012_job_trace_links")]
AFTER = [("django_debounce", "0013_job_table_health")]


def _rows(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _storage() -> set[str]:
    ((options,),) = _rows("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (TABLE,))
    return set(options or [])


def _claim_index() -> str:
    ((definition,),) = _rows(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'debounce_job_claim'"
    )
    return definition


@pytest.mark.django_db
def test_the_job_table_vacuums_after_1000_dead_tuples_plus_1_percent():
    assert _storage() == {
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_threshold=1000",
        "autovacuum_vacuum_insert_scale_factor=0.05",
        "autovacuum_vacuum_insert_threshold=1000",
        "autovacuum_analyze_scale_factor=0.02",
    }


@pytest.mark.django_db
def test_the_claim_index_keeps_its_columns_and_holds_only_ready_rows():
    assert _claim_index() == (
        f"CREATE INDEX debounce_job_claim ON public.{TABLE} USING btree "
        "(status, priority DESC, run_at, id) WHERE ((status)::text = 'READY'::text)"
    )


@pytest.mark.django_db
def test_the_claim_statement_reads_the_partial_index():
    """The claim's own statement, captured from a real claim of one due job, planned
    with the table's statistics of 2,000 finished rows and 1 due job."""
    now = timezone.now()
    common = {"task_name": "hlt.plain", "last_enqueued_at": now, "created_at": now}
    Job.objects.bulk_create(
        Job(status=Job.Status.SUCCESSFUL, run_at=now, finished_at=now, **common)
        for _ in range(2000)
    )
    due = Job.objects.create(run_at=now - timedelta(seconds=1), **common)
    _rows(f'ANALYZE "{TABLE}"')
    with transaction.atomic():
        with CaptureQueriesContext(connection) as captured:
            claimed = claim_jobs(worker_id="hlt", limit=10, lease=timedelta(minutes=1))
        assert [job.pk for job in claimed] == [due.pk]
        transaction.set_rollback(True)
    statement = max((q["sql"] for q in captured.captured_queries), key=len)
    with transaction.atomic():
        _rows("SET LOCAL enable_seqscan = off")  # the plan with 2,000 rows could be either
        plan = "\n".join(row[0] for row in _rows("EXPLAIN " + statement))
        transaction.set_rollback(True)
    assert "debounce_job_claim" in plan, plan


@pytest.mark.django_db(transaction=True)
def test_going_back_restores_the_full_index_and_the_server_defaults():
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        assert _storage() == set()
        assert _claim_index() == (
            f"CREATE INDEX debounce_job_claim ON public.{TABLE} USING btree "
            "(status, priority DESC, run_at, id)"
        )
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        assert "WHERE ((status)::text = 'READY'::text)" in _claim_index()
        assert "autovacuum_vacuum_scale_factor=0.01" in _storage()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("django_debounce"))
