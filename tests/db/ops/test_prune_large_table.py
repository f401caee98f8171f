"""Pruning 200,000 finished jobs on PostgreSQL (issue #11, item 3): batch by batch, nothing else.

The rows are written with one ``INSERT … SELECT generate_series``; the prune
runs through the command. Every DELETE it issues is recorded with the rows it
removed (``cursor.rowcount``): none removes more than one batch.
"""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import call_command
from django.db import connection

from django_debounce.models import DeadLetter, Job, JobDependency
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.slow]

Status = Job.Status
DAY = dt.timedelta(days=1)
FINISHED = ["SUCCESSFUL", "FAILED", "CANCELLED", "EXPIRED", "SHED"]
ROWS = 200_000
BATCH = 5_000


def insert_finished_jobs(count: int, finished_at: dt.datetime) -> None:
    """``count`` finished jobs (statuses in turn), one second apart before ``finished_at``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Job._meta.db_table}
                (task_name, queue, priority, status, args, kwargs, run_at, enqueue_count,
                 last_enqueued_at, attempts, max_retries, error, traceback, metadata, notes,
                 created_at, started_at, finished_at, worker_id)
            SELECT 'tests.noop', 'default', 0, (%s::text[])[1 + n %% 5], '[]', '{{}}',
                   ts, 1, ts, 1, 0, '', '', '{{}}', '', ts, ts, ts, ''
            FROM (SELECT n, %s::timestamptz - n * interval '1 second' AS ts
                  FROM generate_series(1, %s) AS n) AS s
            """,
            [FINISHED, finished_at, count],
        )


def test_pruning_200k_finished_jobs_keeps_live_jobs_dependencies_and_dead_letters(clock):
    insert_finished_jobs(ROWS, T - 8 * DAY)
    assert Job.objects.count() == ROWS
    ready = JobFactory.create_batch(5, created_at=T - 30 * DAY, run_at=T + DAY)
    running = JobFactory.create_batch(
        3, status=Status.RUNNING, created_at=T - 30 * DAY, worker_id="w1"
    )
    recent = JobFactory.create_batch(4, status=Status.SUCCESSFUL, finished_at=T - 6 * DAY)
    old_ids = list(Job.objects.filter(finished_at__lt=T - 7 * DAY).values_list("pk", flat=True))
    dependencies = Job.objects.filter(pk__in=old_ids[:3])
    for waiting, dependency in zip([ready[0], ready[1], running[0]], dependencies, strict=True):
        JobDependency.objects.create(job=waiting, dependency=dependency)
    letters = [
        DeadLetterFactory(job=Job.objects.get(pk=pk), created_at=T - 8 * DAY, args=[n])
        for n, pk in enumerate(old_ids[100:110])
    ]
    kept = {j.pk for j in ready + running + recent} | {d.pk for d in dependencies}

    out = io.StringIO()
    seen: list[tuple[str, int]] = []

    def record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith(("DELETE", "UPDATE")):
            seen.append((sql.split(" WHERE ")[0], context["cursor"].rowcount))
        return result

    with connection.execute_wrapper(record):
        call_command(
            "prune_debounce_jobs", older_than="7d", batch_size=BATCH, no_progress=True, stdout=out
        )

    assert set(Job.objects.values_list("pk", flat=True)) == kept
    assert JobDependency.objects.count() == 3
    assert DeadLetter.objects.count() == 10  # every dead letter kept
    assert set(DeadLetter.objects.values_list("job_id", flat=True)) == {None}
    assert sorted(letter.args[0] for letter in DeadLetter.objects.all()) == list(range(10))
    # No statement removed or changed more than one batch of rows.
    job_table = f'"{Job._meta.db_table}"'
    job_deletes = [n for sql, n in seen if sql.startswith("DELETE") and sql.endswith(job_table)]
    assert sum(job_deletes) == ROWS - 3  # all but the 3 that waiting jobs depend on
    assert max(n for _, n in seen) <= BATCH
    assert f"deleted {ROWS - 3:,} job(s) that finished before" in out.getvalue()
    assert f"in {(ROWS - 3 + BATCH - 1) // BATCH} batch(es) of at most {BATCH:,}" in out.getvalue()
    assert letters[0].retry().args == [0]
