"""A claim that loses a deadlock claims again at once, as an enqueue does (§4.4; issue #8).

The deadlock is a real one, between the worker's claim and an outside
transaction: the outside transaction locks a dependent job D; the claim picks
the expired job E, expires it and, cancelling E's dependents in the same
transaction (§6), waits for D; then the outside transaction asks for E. The
server breaks the cycle by rolling one of them back. The claim is made the
victim: on PostgreSQL it waited first, so its deadlock check runs first; on
MariaDB the lighter transaction loses, and the outside one has written rows.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pytest
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_debounce.db_errors import is_contention
from django_debounce.models import Job, JobDependency
from tests.factories import JobFactory
from tests.procs import WorkerThread, wait_for, waiting_on_a_lock

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

Status = Job.Status


@pytest.fixture
def outside() -> Iterator[BaseDatabaseWrapper]:
    """A second connection to the test database, in a transaction of its own."""
    conn = connections.create_connection(DEFAULT_DB_ALIAS)
    conn.set_autocommit(False)
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


def _records(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


def test_a_claim_that_loses_a_deadlock_claims_again_at_once_without_an_error(caplog, outside):
    caplog.set_level(logging.DEBUG, logger="django_debounce.worker")
    now = timezone.now()
    expired = JobFactory(run_at=now - dt.timedelta(minutes=1), expires_at=now)
    dependent = JobFactory(run_at=now + dt.timedelta(hours=1))
    JobDependency.objects.create(job=dependent, dependency=expired)
    table = connection.ops.quote_name(Job._meta.db_table)
    with outside.cursor() as cursor:
        # Rows written first make this transaction the heavier one: MariaDB rolls back the
        # lighter transaction of a deadlock (PostgreSQL: the one whose check runs first).
        for i in range(200):
            cursor.execute(
                f"UPDATE {table} SET notes = %s WHERE id = %s", [f"outside {i}", dependent.pk]
            )
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [dependent.pk])

    worker = WorkerThread("contended", poll_interval=0.1).start()
    try:
        # The claim expired E (holding its row) and now waits for D, cancelling E's dependents.
        wait_for(waiting_on_a_lock, timeout=30, interval=0.25, what="the claim to wait for D")
        with outside.cursor() as cursor:
            # Closes the cycle; returns once the claim, the victim, has been rolled back.
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [expired.pk])
        wait_for(
            lambda: _records(caplog, "claim_retry"),
            timeout=30,
            what="the worker to claim again after the lost deadlock",
        )
        outside.rollback()  # E and D are free: the next poll expires E and cancels D
        wait_for(
            lambda: Job.objects.get(pk=dependent.pk).status == Status.CANCELLED,
            timeout=30,
            what="the claim to expire E and cancel D",
        )
    finally:
        worker.stop()

    [retry] = _records(caplog, "claim_retry")
    assert "attempt 1" in retry.getMessage()
    assert "deadlock" in retry.getMessage().lower()
    # Not a database outage: no ERROR line, no back-off.
    assert _records(caplog, "db_error") == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert Job.objects.get(pk=expired.pk).status == Status.EXPIRED
    assert Job.objects.get(pk=expired.pk).attempts == 0  # it never ran


def test_a_real_lock_wait_timeout_is_contention_and_another_server_error_is_not(outside):
    """is_contention on errors the server raised: a lock wait timed out (PostgreSQL's
    lock_timeout 55P03, MariaDB's 1205) is contention; an unknown column is not."""
    job = JobFactory()
    table = connection.ops.quote_name(Job._meta.db_table)
    with outside.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [job.pk])
    short_wait = (
        "SET SESSION innodb_lock_wait_timeout = 1"
        if connection.vendor == "mysql"
        else "SET lock_timeout = '200ms'"
    )
    waiter = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        waiter.set_autocommit(False)
        with waiter.cursor() as cursor:
            cursor.execute(short_wait)
            with pytest.raises(OperationalError) as timed_out:
                cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [job.pk])
        waiter.rollback()
        with waiter.cursor() as cursor:
            with pytest.raises(Exception) as unknown:  # OperationalError on MariaDB
                cursor.execute(f"SELECT no_such_column FROM {table}")
        waiter.rollback()
    finally:
        waiter.close()
    assert is_contention(timed_out.value)
    assert not is_contention(unknown.value)
