"""What one handed-off job costs the Celery task, and the connection it keeps (decisions 183-185).

* the task runs one statement, the take (MariaDB: the take reads its row after the
  ``UPDATE``, having no ``RETURNING``), in its own autocommit transaction; the successes
  of several jobs are then one ``UPDATE`` (decision 215);
* Celery's Django fixup closes the worker's connections before and after every task
  (``CELERY_DB_REUSE_MAX`` unset): the task's own connection outlives it, so jobs in a
  row run on one database session; one the server ended is replaced before the take;
* no thread is started per job: one keeper thread per process renews leases.

The task body runs in this process (a Celery task object called directly runs its
function) with the real ``celery.fixups.django.DjangoWorkerFixup`` closing connections
around it as a worker's ``task_prerun``/``task_postrun`` do.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_debounce.contrib.celery import handoff, kept_connection
from django_debounce.contrib.celery.batched_successes import process_successes
from django_debounce.contrib.celery.tasks import run_handoff_message
from django_debounce.models import Job
from django_debounce.run.lease_keeper import process_keeper
from tests.celery_app import app
from tests.testapp.tasks_celery import fails, record

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status


@pytest.fixture
def fixup() -> Iterator[DjangoWorkerFixup]:
    """Celery's Django fixup as a worker installs it (no ``CELERY_DB_REUSE_MAX``)."""
    assert not app.conf.get("CELERY_DB_REUSE_MAX")
    yield DjangoWorkerFixup(app)
    kept = getattr(kept_connection._local, "kept", {})
    for entry in kept.values():
        entry["wrapper"].close()
    kept.clear()


def _run_as_a_worker(fixup: DjangoWorkerFixup, job_id: int) -> object:
    """Run the task as a Celery worker does: the fixup's close before and after it."""
    fixup.close_database()  # task_prerun
    try:
        return run_handoff_message(job_id)
    finally:
        fixup.close_database()  # task_postrun


def _handed_off(tag: str) -> int:
    job = record.delay(tag)
    assert handoff.claim_for_handoff(scheduler_id="s", limit=10, lease=dt.timedelta(minutes=5))
    return job.pk


def _the_tasks_connection():
    """The connection object the task ran on: its own, or (SQLite) the thread's usual one."""
    if connection.vendor == "sqlite":
        return connection
    return kept_connection._local.kept["default"]["wrapper"]


def test_a_handed_off_job_costs_the_task_the_take_and_its_success_a_share_of_one_update(
    fixup, settings
) -> None:
    """Decision 215: the task's thread runs the take alone; the success waits for its batch."""
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 30  # written when the test says, not before
    _run_as_a_worker(fixup, _handed_off("warm-up"))  # compiles the statements once per process
    process_successes.flush_all()
    job_ids = [_handed_off(f"counted-{n}") for n in range(3)]
    with CaptureQueriesContext(_the_tasks_connection()) as ctx:
        for n, job_id in enumerate(job_ids):
            assert _run_as_a_worker(fixup, job_id)["tag"] == f"counted-{n}"
    statements = [query["sql"].split()[0] for query in ctx.captured_queries]
    job_table = [q["sql"] for q in ctx.captured_queries if "django_debounce_job" in q["sql"]]
    take = 2 if connection.vendor == "mysql" else 1  # MariaDB: UPDATE, then the row's SELECT
    assert len(job_table) == 3 * take, job_table
    # PostgreSQL: the take's commit skips the WAL flush (SET LOCAL, same round trip).
    prefix = handoff.ASYNC_COMMIT if connection.vendor == "postgresql" else ""
    assert job_table[0].startswith(f"{prefix}UPDATE"), job_table[0]
    # The task's own two statements (record's CallLog INSERT and UPDATE) apart, nothing else:
    # no BEGIN/COMMIT pair, no SAVEPOINT, no lease renewal, no outcome yet.
    assert statements.count("INSERT") == 3 and len(statements) == 3 * (take + 2), statements
    assert Job.objects.filter(pk__in=job_ids, status=Status.RUNNING).count() == 3
    with CaptureQueriesContext(_the_tasks_connection()) as ctx:
        process_successes.flush_all()  # the writer thread's work, run here to count it
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == ["UPDATE"]
    assert "'SUCCESSFUL'" in ctx.captured_queries[0]["sql"]
    rows = Job.objects.filter(pk__in=job_ids)
    assert sorted(rows.values_list("status", "attempts")) == [(Status.SUCCESSFUL, 1)] * 3
    if connection.vendor == "postgresql":  # SET LOCAL: the take's transaction alone
        with _the_tasks_connection().cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"


@pytest.mark.postgres
def test_jobs_in_a_row_share_one_database_session_whatever_the_fixup_closes(fixup) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: the thread's own connection is used, nothing to keep")
    sessions = set()
    for n in range(3):
        _run_as_a_worker(fixup, _handed_off(f"row-{n}"))
        own = _the_tasks_connection()
        with own.cursor() as cursor:
            cursor.execute(
                "SELECT pg_backend_pid()"
                if own.vendor == "postgresql"
                else "SELECT CONNECTION_ID()"
            )
            sessions.add(cursor.fetchone()[0])
    assert len(sessions) == 1, "one session for three jobs"
    assert connections["default"].connection is None, "the fixup closed the thread's usual one"


@pytest.mark.postgres
def test_a_kept_connection_the_server_ended_is_replaced_before_the_next_take(fixup) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    _run_as_a_worker(fixup, _handed_off("first"))
    own = _the_tasks_connection()
    with own.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (old,) = cursor.fetchone()
    kept_connection._local.kept["default"]["used"] -= kept_connection.IDLE_CHECK  # it idled
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old])
    connection.close()
    job_id = _handed_off("after-the-cut")
    assert _run_as_a_worker(fixup, job_id)["tag"] == "after-the-cut"
    with own.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != old


def test_a_failed_job_on_the_kept_connection_still_ends_in_its_celery_state(fixup) -> None:
    """The retry's Celery RETRY and the row agree, written through the kept connection."""
    from celery.exceptions import Retry

    job = fails.delay("kept")
    handoff.claim_for_handoff(scheduler_id="s", limit=10, lease=dt.timedelta(minutes=5))
    with pytest.raises(Retry):
        _run_as_a_worker(fixup, job.pk)
    assert Job.objects.get(pk=job.pk).status == Status.READY


def test_no_thread_is_started_per_job(fixup) -> None:
    _run_as_a_worker(fixup, _handed_off("first"))
    threads = threading.active_count()
    renewals = process_keeper.renewals
    for n in range(5):
        _run_as_a_worker(fixup, _handed_off(f"short-{n}"))
    assert threading.active_count() == threads
    assert process_keeper.renewals == renewals, "a job far within its lease is never renewed"
    process_successes.flush_all()  # a success waiting for its write is held until written
    assert process_keeper.held_ids() == []
