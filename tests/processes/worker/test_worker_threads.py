"""The worker with threads and real transactions: B02, B31, B32 (§4.5, §7, §11)."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import signals
from django_debounce.flow.rules import claimable_jobs
from django_debounce.models import DeadLetter, Job
from django_debounce.worker.loop import Worker
from tests.conftest import T, child_env
from tests.testapp.models import CallLog
from tests.testapp.tasks_worker import ENTERED, GATES, async_result, record_tag, slow_tag
from tests.testapp.tasks_worker import sync_profile as sync_profile_task

M = dt.timedelta(minutes=1)
#: The controlled clock jumps minutes in an instant, far faster than a worker renews its
#: lease (every third of it, in real time): the threaded tests use a lease the jumps stay in.
LONG_LEASE = dt.timedelta(hours=2)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``predicate`` (real time) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)


def status_of(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def log_keys(task: str) -> list[str]:
    return list(CallLog.objects.filter(task=task).order_by("id").values_list("key", flat=True))


@contextmanager
def worker_thread(**options: Any) -> Iterator[Worker]:
    """Run a real ``Worker`` (no signal handlers, 50 ms polls) in a thread for the block."""
    options.setdefault("poll_interval", 0.05)
    worker = Worker(handle_signals=False, **options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        for gate in GATES.values():  # never leave a gated task blocked
            gate.set()
        worker.stop()
        thread.join(20)
    assert not thread.is_alive(), "worker thread did not stop"
    assert errors == []


@pytest.fixture
def gate() -> Iterator[Callable[[str], threading.Event]]:
    def make(tag: str) -> threading.Event:
        GATES[tag] = threading.Event()
        ENTERED[tag] = threading.Event()
        return GATES[tag]

    yield make
    for event in GATES.values():
        event.set()
    GATES.clear()
    ENTERED.clear()


# -- B02: an enqueue during the run queues behind it ----------------------------------------

FROZEN_FIELDS = (
    "status",
    "args",
    "kwargs",
    "worker_id",
    "attempts",
    "started_at",
    "run_at",
    "opened_at",
    "max_run_at",
    "enqueue_count",
    "last_enqueued_at",
)


def snapshot(job: Job) -> dict[str, Any]:
    return Job.objects.values(*FROZEN_FIELDS).get(pk=job.pk)


def start_j1(clock, gate) -> tuple[Job, threading.Event]:
    j1 = sync_profile_task.delay(1, "v1")
    assert (j1.run_at, j1.max_run_at) == (T + 5 * M, T + 30 * M)
    release = gate("v1")
    clock(minutes=5)
    return j1, release


def enqueue_j2(clock, j1: Job) -> Job:
    clock(minutes=6)
    j2 = sync_profile_task.delay(1, "v2")
    assert j2.outcome == "created"
    assert j2.pk != j1.pk
    assert j2.status == Job.Status.READY
    assert j2.is_open_window
    assert (j2.opened_at, j2.run_at, j2.max_run_at) == (T + 6 * M, T + 11 * M, T + 36 * M)
    assert (j2.args, j2.kwargs) == ([1, "v2"], {})
    return j2


@pytest.mark.django_db(transaction=True)
def test_b02_enqueue_during_run_queues_behind(clock, gate):
    j1, release = start_j1(clock, gate)
    with worker_thread(concurrency=2, lease=LONG_LEASE) as worker:
        assert ENTERED["v1"].wait(15), "the worker never started J1"
        running = snapshot(j1)
        assert running["status"] == Job.Status.RUNNING
        assert running["worker_id"] == worker.worker_id
        assert (running["attempts"], running["started_at"]) == (1, T + 5 * M)

        j2 = enqueue_j2(clock, j1)
        assert snapshot(j1) == running  # only the lease may move
        assert Job.objects.count() == 2

        clock(minutes=7)
        release.set()
        wait_for(lambda: status_of(j1) == Job.Status.SUCCESSFUL)
        time.sleep(0.3)  # several polls at T+7m: J2 is not due yet
        assert status_of(j2) == Job.Status.READY

        clock(minutes=11)
        wait_for(lambda: status_of(j2) == Job.Status.SUCCESSFUL)

    j1.refresh_from_db()
    j2.refresh_from_db()
    assert (j1.result, j1.finished_at, j1.enqueue_count) == ("v1", T + 7 * M, 1)
    assert (j2.result, j2.started_at, j2.attempts) == ("v2", T + 11 * M, 1)
    assert log_keys("wrk.sync_profile") == ["start:v1", "end:v1", "start:v2", "end:v2"]


@pytest.mark.django_db(transaction=True)
def test_b02_run_in_flight_holds_the_next_window_back(clock, gate):
    """Variant: J1 still running at T+11m; polls leave J2 READY; J2 starts after J1 ends."""
    j1, release = start_j1(clock, gate)
    with worker_thread(concurrency=2, lease=LONG_LEASE):
        assert ENTERED["v1"].wait(15)
        j2 = enqueue_j2(clock, j1)
        clock(minutes=11)
        time.sleep(0.5)  # ~10 polls with a free thread and J2 due
        assert status_of(j2) == Job.Status.READY
        assert status_of(j1) == Job.Status.RUNNING
        assert Job.objects.get(pk=j2.pk).attempts == 0

        clock(minutes=12)
        release.set()
        wait_for(lambda: status_of(j2) == Job.Status.SUCCESSFUL)

    j1.refresh_from_db()
    j2.refresh_from_db()
    assert j1.finished_at == T + 12 * M
    assert j2.started_at >= j1.finished_at
    assert log_keys("wrk.sync_profile") == ["start:v1", "end:v1", "start:v2", "end:v2"]


@pytest.mark.django_db(transaction=True)
def test_b02_burst_does_not_wait_for_a_held_back_job(clock, gate):
    """Decision: ``--burst`` exits without waiting for a job held back by its key's run (§11)."""
    j1, release = start_j1(clock, gate)
    with worker_thread(concurrency=1, lease=LONG_LEASE):
        assert ENTERED["v1"].wait(15)
        j2 = enqueue_j2(clock, j1)
        clock(minutes=11)
        began = time.monotonic()
        call_command("run_debounce_worker", burst=True)
        # It returned without waiting for J1 (gated up to 30 s); the slack is for a loaded box.
        assert time.monotonic() - began < 20
        assert status_of(j2) == Job.Status.READY
        assert status_of(j1) == Job.Status.RUNNING
        assert log_keys("wrk.sync_profile") == ["start:v1"]
        release.set()
        wait_for(lambda: status_of(j2) == Job.Status.SUCCESSFUL)


# -- threaded modes --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_max_jobs_without_burst_returns_after_that_many(clock):
    for i in range(5):
        record_tag.apply_async(args=(f"m{i}",), countdown=0, priority=10 - i)
    worker = Worker(max_jobs=2, poll_interval=0.05, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive()
    assert log_keys("wrk.tag") == ["m0", "m1"]
    assert worker.processed == 2
    assert Job.objects.filter(status=Job.Status.READY).count() == 3


@pytest.mark.django_db(transaction=True)
def test_async_tasks_run_on_worker_threads(clock):
    jobs = [async_result.delay(f"a{i}") for i in range(3)]
    call_command("run_debounce_worker", burst=True, concurrency=2)
    assert sorted(log_keys("wrk.async_result")) == ["a0", "a1", "a2"]
    for job in jobs:
        job.refresh_from_db()
        assert job.status == Job.Status.SUCCESSFUL
        assert job.result["amount"] == {"__debounce__": ["decimal", "2.50"]}


# -- B31: no SKIP LOCKED --------------------------------------------------------------------


def no_skip_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every connection report no ``SKIP LOCKED``: new ones (threads) through the features
    class, this thread's through its instance (MariaDB's backend caches the feature there)."""
    monkeypatch.setattr(type(connection.features), "has_select_for_update_skip_locked", False)
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)


@pytest.mark.django_db(transaction=True)
def test_b31_worker_without_skip_locked(monkeypatch):
    """Decision: without SKIP LOCKED the claim uses plain ``SELECT … FOR UPDATE``."""
    no_skip_locked(monkeypatch)
    jobs = [record_tag.delay(f"b31-{i}") for i in range(5)]

    with CaptureQueriesContext(connection) as ctx:
        call_command("run_debounce_worker", burst=True)

    assert sorted(log_keys("wrk.tag")) == [f"b31-{i}" for i in range(5)]
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 1)
    sql = " ".join(q["sql"] for q in ctx.captured_queries)
    assert "SKIP LOCKED" not in sql
    if connection.features.has_select_for_update:
        assert "FOR UPDATE" in sql


@pytest.mark.django_db(transaction=True)
def test_b31_command_line_burst_without_skip_locked_exits_0():
    for i in range(5):
        record_tag.delay(f"cli-{i}")
    code = textwrap.dedent(
        """
        import django
        django.setup()
        from django.db import connection
        type(connection.features).has_select_for_update_skip_locked = False
        from django.core.management import execute_from_command_line
        execute_from_command_line(["manage.py", "run_debounce_worker", "--burst"])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(log_keys("wrk.tag")) == [f"cli-{i}" for i in range(5)]
    assert not Job.objects.filter(status=Job.Status.READY).exists()


def drain_with_two_workers(count: int) -> list[tuple[str, int]]:
    """Enqueue ``count`` due jobs and drain them with 2 burst workers started together."""
    for i in range(count):
        slow_tag.delay(f"s{i}", 0.02)
    starts: list[tuple[str, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def on_started(sender: Any, job: Job, **kwargs: Any) -> None:
        with lock:
            starts.append((job.worker_id, job.pk))

    def run(name: str) -> None:
        barrier.wait()
        Worker(burst=True, worker_id=name, handle_signals=False).run()

    signals.job_started.connect(on_started, weak=False)
    try:
        threads = [threading.Thread(target=run, args=(f"w{n}",)) for n in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        signals.job_started.disconnect(on_started)
    return starts


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_b31_two_workers_with_skip_locked_run_each_job_once(clock):
    assert connection.features.has_select_for_update_skip_locked
    starts = drain_with_two_workers(50)
    ids = [pk for _, pk in starts]
    assert len(ids) == 50
    assert len(set(ids)) == 50
    assert {worker for worker, _ in starts} == {"w1", "w2"}
    assert sorted(log_keys("wrk.slow_tag")) == sorted(f"s{i}" for i in range(50))
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL, attempts=1).count() == 50


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_b31_two_workers_without_skip_locked_run_each_job_once(clock, monkeypatch):
    no_skip_locked(monkeypatch)
    starts = drain_with_two_workers(20)
    # A worker blocked behind the other's claim may find nothing left and exit early (it
    # never waits); whatever it leaves, a last burst runs. No job runs twice.
    call_command("run_debounce_worker", burst=True)
    assert len({pk for _, pk in starts}) == len(starts) > 0
    assert CallLog.objects.count() == 20
    assert sorted(log_keys("wrk.slow_tag")) == sorted(f"s{i}" for i in range(20))
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL, attempts=1).count() == 20


# -- B32: a big table of finished rows -------------------------------------------------------


def _jobs(count: int, batch: int, make: Callable[[int], Job]) -> list[int]:
    ids: list[int] = []
    for start in range(0, count, batch):
        rows = Job.objects.bulk_create([make(i) for i in range(start, min(count, start + batch))])
        ids.extend(row.pk for row in rows)
    return ids


def _checksum(exclude: list[int]) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*), md5(string_agg(concat_ws('|', id, status, run_at, attempts,
                   worker_id, started_at, finished_at, lease_expires_at, window_key,
                   result::text, error, enqueue_count), ',' ORDER BY id))
            FROM django_debounce_job WHERE NOT (id = ANY(%s))
            """,
            [exclude],
        )
        jobs = cursor.fetchone()
        cursor.execute(
            """
            SELECT count(*), md5(string_agg(concat_ws('|', id, job_id, retried_at, retry_job_id,
                   reason), ',' ORDER BY id))
            FROM django_debounce_deadletter
            """
        )
        letters = cursor.fetchone()
    return (*jobs, *letters)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db
def test_b32_claims_right_rows_in_big_table(clock, burst):
    s = dt.timedelta(seconds=1)

    # The 220,000 finished rows and their 20,000 dead letters are generated by the server
    # (INSERT … SELECT generate_series): bulk_create of that many rows takes minutes here.
    with connection.cursor() as cursor:
        for status, first, count in (
            (Job.Status.SUCCESSFUL, 1, 200_000),
            (Job.Status.FAILED, 200_001, 20_000),
        ):
            cursor.execute(
                """
                INSERT INTO django_debounce_job (task_name, queue, priority, status, args, kwargs,
                    run_at, enqueue_count, last_enqueued_at, attempts, max_retries, result, error,
                    traceback, metadata, notes, created_at, started_at, finished_at, worker_id)
                SELECT 'wrk.tag', 'default', (i %% 201) - 100, %(status)s,
                    jsonb_build_array('old-' || i), '{}'::jsonb,
                    %(t)s - interval '1 day' - i * interval '1 second', 1,
                    %(t)s - interval '1 day' - i * interval '1 second', 1, 0,
                    CASE WHEN %(status)s = 'SUCCESSFUL' THEN to_jsonb('old-' || i) END,
                    CASE WHEN %(status)s = 'FAILED' THEN 'ValueError: old' ELSE '' END,
                    '', '{}'::jsonb, '',
                    %(t)s - interval '1 day' - i * interval '1 second',
                    %(t)s - interval '1 day' - i * interval '1 second',
                    %(t)s - interval '1 day' - (i - 1) * interval '1 second', 'old-worker'
                FROM generate_series(%(first)s, %(last)s) AS i
                """,
                {"status": str(status), "t": T, "first": first, "last": first + count - 1},
            )
        cursor.execute(
            """
            INSERT INTO django_debounce_deadletter (job_id, task_name, queue, args, kwargs,
                reason, kind, metadata, error, traceback, created_at, retry_depth)
            SELECT id, task_name, queue, args, kwargs, 'failed: 1 attempt(s); ValueError: old',
                'failure', '{"attempts": 1}'::jsonb, error, '', finished_at, 0
            FROM django_debounce_job WHERE status = 'FAILED'
            """
        )
    _jobs(
        5_000,
        5_000,
        lambda i: Job(
            task_name="wrk.tag",
            args=[f"future-{i}"],
            priority=100,
            run_at=T + (i + 1) * s,
            created_at=T,
            last_enqueued_at=T,
        ),
    )
    _jobs(
        20,
        20,
        lambda i: Job(
            task_name="wrk.tag",
            args=[f"running-{i}"],
            status=Job.Status.RUNNING,
            run_at=T - 2 * M,
            created_at=T - 2 * M,
            last_enqueued_at=T - 2 * M,
            started_at=T - M,
            attempts=1,
            worker_id="busy-worker",
            lease_expires_at=T + 30 * s + i * s,
        ),
    )
    due = [  # (tag, priority, run_at)
        ("p0-old", 0, T - 50 * s),
        ("p5-new", 5, T - 1 * s),
        ("m3", -3, T - 90 * s),
        ("p5-old", 5, T - 40 * s),
        ("p10", 10, T),
        ("p0-new", 0, T - 20 * s),
        ("p0-mid", 0, T - 30 * s),
        ("m100", -100, T - 100 * s),
        ("p100", 100, T - 5 * s),
        ("p5-mid", 5, T - 10 * s),
    ]
    due_ids = _jobs(
        10,
        10,
        lambda i: Job(
            task_name="wrk.tag",
            args=[due[i][0]],
            priority=due[i][1],
            run_at=due[i][2],
            created_at=due[i][2],
            last_enqueued_at=due[i][2],
        ),
    )
    assert Job.objects.count() == 225_030
    assert DeadLetter.objects.count() == 20_000

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_debounce_job")
    plan = claimable_jobs(T)[:10].explain()
    # The job table itself (not django_debounce_jobdependency, whose scan is of the few edges).
    assert not re.search(r"Seq Scan on django_debounce_job\s", plan), plan
    assert "Index Scan" in plan, plan

    before = _checksum(due_ids)
    burst(concurrency=1)
    after = _checksum(due_ids)

    expected = [tag for tag, _, _ in sorted(due, key=lambda d: (-d[1], d[2]))]
    assert log_keys("wrk.tag") == expected
    assert after == before
    assert (
        Job.objects.filter(pk__in=due_ids, status=Job.Status.SUCCESSFUL, attempts=1).count() == 10
    )
    assert Job.objects.filter(status=Job.Status.RUNNING, worker_id="busy-worker").count() == 20
    assert Job.objects.filter(status=Job.Status.READY).count() == 5_000


@pytest.mark.postgres
@pytest.mark.django_db
def test_inline_burst_survives_a_database_error_in_the_task(clock, burst):
    """A task's IntegrityError inside the caller's transaction is rolled back to a savepoint.

    On PostgreSQL an error aborts the whole transaction; without the savepoint the
    worker could not record the failure and the caller's transaction would be unusable.
    """
    from django.db import IntegrityError

    from django_debounce import task
    from tests.testapp.models import Order

    @task(max_retries=0)
    def duplicate_order() -> None:
        Order.objects.create(name="dup")
        Order.objects.create(name="dup")

    job = duplicate_order.delay()
    burst()
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.error.startswith(f"{IntegrityError.__module__}.IntegrityError: ")
    assert Order.objects.count() == 0  # the task's writes were rolled back with it
    assert DeadLetter.objects.filter(job=job).count() == 1
