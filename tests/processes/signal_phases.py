"""Bring a real worker or dispatcher process to one phase of its loop, and hold it there.

The helpers of ``test_signals_at_every_phase*.py`` (issue #18 item 2). Nothing here
sleeps and hopes: a phase is reached when the database or the process says so.

* a run is held by ``rel.gate``/``cel.gate``, which blocks until a barrier file exists;
* the claim statement is held by an outside ``LOCK TABLE … IN EXCLUSIVE MODE``
  (PostgreSQL), seen waiting in ``pg_stat_activity``;
* a write (the batched success write, a lease renewal) is held by an outside row lock
  (:class:`RowLock`, PostgreSQL and MariaDB), seen waiting with its own statement text
  (``pg_stat_activity.query``, ``information_schema.innodb_trx.trx_query``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.utils import timezone

from django_debounce.models import Job
from tests.procs import Proc
from tests.testapp.models import CallLog

#: The batched success write (``outcome_batches.write_successes``): its SET starts with the
#: status (``_`` matches PostgreSQL's ``"`` and MariaDB's backtick). The query text carries the
#: values: Django binds parameters on the client.
FLUSH = "UPDATE %SET _status_ = 'SUCCESSFUL'%"
#: A lease renewal (``leases.renew_leases``): an UPDATE that sets the lease alone.
RENEWAL = "UPDATE %SET _lease_expires_at_ = %"


def pg_dsn() -> str:
    """A libpq connection string for the test database (PostgreSQL)."""
    db = connection.settings_dict
    return (
        f"host={db.get('HOST') or '127.0.0.1'} port={db.get('PORT') or 5432} "
        f"user={db.get('USER') or 'postgres'} dbname={db['NAME']}"
    )


@contextmanager
def table_locked() -> Iterator[psycopg.Connection]:
    """Hold ``LOCK TABLE django_debounce_job IN EXCLUSIVE MODE`` until ``rollback()`` (PostgreSQL).

    EXCLUSIVE lets plain reads (a worker's peek, the reclaim's look) through and holds
    every claim's ``SELECT … FOR UPDATE`` until the holder rolls back.
    """
    with psycopg.connect(pg_dsn()) as holder:
        holder.execute("LOCK TABLE django_debounce_job IN EXCLUSIVE MODE")
        yield holder


def claim_waits_on_lock(application_name: str | None = None) -> bool:
    """A claim statement waits for a lock (PostgreSQL, under :func:`table_locked`).

    Under ``EXCLUSIVE`` only a locking read waits among reads: a ``SELECT``/``WITH``
    waiting for a lock is the claim's ``… FOR UPDATE``.
    """
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND (query ILIKE 'SELECT%%' OR query ILIKE 'WITH%%')"
    )
    params: list[str] = []
    if application_name is not None:
        sql += " AND application_name = %s"
        params.append(application_name)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.fetchone()[0])


class RowLock:
    """Hold ``SELECT … FOR UPDATE`` on job rows from a connection of its own until :meth:`release`.

    A worker's write to those rows (its batched success write, its lease renewal) then
    waits inside the statement, where :func:`statement_waits` sees it.
    """

    def __init__(self, *job_ids: int) -> None:
        self.holder = connections.create_connection(DEFAULT_DB_ALIAS)
        self.holder.set_autocommit(False)
        table = self.holder.ops.quote_name(Job._meta.db_table)
        marks = ", ".join(["%s"] * len(job_ids))
        with self.holder.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {table} WHERE id IN ({marks}) FOR UPDATE", job_ids)
            assert len(cursor.fetchall()) == len(job_ids)
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.holder.rollback()
            self.holder.close()

    def __enter__(self) -> RowLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def statement_waits(pattern: str) -> bool:
    """A statement of the test database whose text is ``LIKE pattern`` waits for a row lock."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx AS trx "
                "JOIN information_schema.processlist AS p ON p.id = trx.trx_mysql_thread_id "
                "WHERE trx.trx_state = 'LOCK WAIT' AND p.db = DATABASE() "
                "AND trx.trx_query LIKE %s",
                [pattern],
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                [pattern],
            )
        return int(cursor.fetchone()[0]) > 0


def other_sessions() -> int:
    """How many other sessions are connected to the test database (a killed client's
    server session lingers until its statement ends)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
        return int(cursor.fetchone()[0])


def alive_or_fail(proc: Proc, check: Callable[[], object]) -> Callable[[], object]:
    """``check``, failing at once (with the log) if ``proc`` exited meanwhile."""

    def run() -> object:
        value = check()
        if not value:
            assert proc.alive(), f"{proc.name} exited {proc.popen.poll()}\n{proc.tail()}"
        return value

    return run


def exit_status(signum: int) -> int:
    """The status a worker or dispatcher exits with: 0 after SIGTERM, -9 after SIGKILL."""
    return 0 if signum == signal.SIGTERM else -signal.SIGKILL


def row(job: Job) -> tuple[str, int]:
    """``(status, attempts)`` of ``job`` as the database has it now."""
    found = Job.objects.get(pk=job.pk)
    return (found.status, found.attempts)


def claim_fields(job: Job) -> dict[str, object]:
    """What a claim changes of ``job``'s row, as the database has it now (to compare "as before")."""
    found = Job.objects.get(pk=job.pk)
    names = ("status", "attempts", "worker_id", "lease_expires_at", "started_at", "run_at")
    return {name: getattr(found, name) for name in names}


def runs(job: Job, *, finished: bool | None = None) -> int:
    """How many runs of ``job`` began (``finished``: only those that ended, or did not)."""
    qs = CallLog.objects.filter(job_id=job.pk)
    if finished is not None:
        qs = qs.filter(finished_at__isnull=not finished)
    return qs.count()


def lease_lapsed(*jobs: Job) -> Callable[[], bool]:
    """Every job's lease has lapsed on the package's clock."""

    def check() -> bool:
        now = timezone.now()
        leases = Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list(
            "lease_expires_at", flat=True
        )
        return all(lease is None or lease < now for lease in leases)

    return check


def touch(path: Path) -> None:
    """Open a barrier: every ``gate`` run waiting on ``path`` ends."""
    path.touch()
