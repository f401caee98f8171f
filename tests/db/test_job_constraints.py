"""The database keeps the claimed-job rule (issue #8, item 7; §4.1, §4.5, §6).

``Job.window_key`` is what an enqueue slides and ``Job.unique_lock`` what a
coalescing call joins. CHECK constraints allow the first only on a READY job
and the second only on a READY or RUNNING one, so no write, from the package or
from an operator, can leave a claimed or finished job open to an enqueue.
Migration 0004 repairs rows written before the constraints existed.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from django_debounce.models import Job
from tests.factories import JobFactory

KEY = "a" * 64
BEFORE = [("django_debounce", "0003_admin_indexes")]
AFTER = [("django_debounce", "0004_job_window_lock_checks")]


def raw_update(sql: str, params: list[object]) -> None:
    table = connection.ops.quote_name(Job._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.format(table=table), params)


@pytest.mark.django_db
def test_an_operators_update_cannot_claim_an_open_window_and_keep_its_key():
    window = JobFactory(window_key=KEY, key_hash=KEY, debounce_key="k")
    with pytest.raises(IntegrityError):
        raw_update("UPDATE {table} SET status = %s WHERE id = %s", ["RUNNING", window.pk])
    window.refresh_from_db()
    assert (window.status, window.window_key) == (Job.Status.READY, KEY)


@pytest.mark.django_db
def test_an_orm_update_cannot_give_a_running_job_a_window_key():
    running = JobFactory(status=Job.Status.RUNNING, attempts=1, key_hash=KEY)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=running.pk).update(window_key=KEY)
    assert Job.objects.get(pk=running.pk).window_key is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status", [s for s in Job.Status.values if s not in (Job.Status.READY, Job.Status.RUNNING)]
)
def test_a_finished_job_can_hold_neither_key(status):
    window = JobFactory(window_key=KEY, key_hash=KEY)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=window.pk).update(status=status)
    locked = JobFactory(status=Job.Status.RUNNING, unique_key="u", unique_lock=KEY)
    with pytest.raises(IntegrityError):
        raw_update("UPDATE {table} SET status = %s WHERE id = %s", [status, locked.pk])
    assert list(Job.objects.order_by("pk").values_list("status", "window_key", "unique_lock")) == [
        (Job.Status.READY, KEY, None),
        (Job.Status.RUNNING, None, KEY),
    ]


@pytest.mark.django_db
def test_the_states_that_hold_the_keys_still_may():
    JobFactory(window_key=KEY, key_hash=KEY, unique_lock="b" * 64)
    JobFactory(status=Job.Status.RUNNING, attempts=1, unique_lock="c" * 64)
    Job.objects.update(notes="written")  # both rows pass the checks
    assert Job.objects.filter(notes="written").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_migration_releases_keys_that_rows_hold_past_their_state():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        OldJob = executor.loader.project_state(BEFORE).apps.get_model("django_debounce", "Job")
        now = "2026-03-01T12:00:00Z"
        common = {"task_name": "tests.noop", "run_at": now, "last_enqueued_at": now}
        rows = {
            "open window": OldJob.objects.create(
                status="READY", window_key="w1", unique_lock="u1", created_at=now, **common
            ),
            "claimed window": OldJob.objects.create(
                status="RUNNING", window_key="w2", unique_lock="u2", created_at=now, **common
            ),
            "finished window": OldJob.objects.create(
                status="SUCCESSFUL", window_key="w3", unique_lock="u3", created_at=now, **common
            ),
            "cancelled": OldJob.objects.create(
                status="CANCELLED", unique_lock="u4", created_at=now, **common
            ),
        }
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        stored = dict(Job.objects.values_list("pk", "window_key"))
        locks = dict(Job.objects.values_list("pk", "unique_lock"))
        assert {name: (stored[row.pk], locks[row.pk]) for name, row in rows.items()} == {
            "open window": ("w1", "u1"),
            "claimed window": (None, "u2"),
            "finished window": (None, None),
            "cancelled": (None, None),
        }
        # Reversible: back to 0003 (the constraints go, the rows stay repaired) and forward.
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert Job.objects.filter(window_key__isnull=False).count() == 1
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("django_debounce"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(window_key="w1").update(status="RUNNING")
