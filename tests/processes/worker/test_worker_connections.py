"""Worker database connections (§7): reconnects after a dropped connection, never leaks.

Each worker subprocess tags its connections with its own ``application_name``
(``DEBOUNCE_TEST_APP_NAME``), so ``pg_stat_activity`` shows exactly its
backends. ``CONN_MAX_AGE`` comes from ``DEBOUNCE_TEST_CONN_MAX_AGE``.

Documented figures asserted here: a worker holds at most ``concurrency + 1``
connections (one per job thread, plus the loop's own for claims, lease
renewal and maintenance). Idle after a drain it holds at most 1 (the loop's,
closed and reopened on every poll) with ``CONN_MAX_AGE=0``, and at most ``concurrency + 1`` with a persistent
``CONN_MAX_AGE`` (reused, closed once older than the max age). Busy, it opens at most one
connection per job with ``CONN_MAX_AGE=0`` (the loop keeps its own while jobs run).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connections

from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.procs import app_name, pg_backends, pg_terminate, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import one_query, work

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CONN_MAX_AGES = pytest.mark.parametrize("conn_max_age", ["0", "None", "60"])


def _all_done(ids, worker):
    def check() -> bool:
        assert worker.alive(), worker.tail()
        return Job.objects.filter(pk__in=ids, status=Job.Status.SUCCESSFUL).count() == len(ids)

    return check


@CONN_MAX_AGES
def test_b34_worker_reconnects(tmp_path, conn_max_age):
    name = app_name("b34")
    env = child_env(DEBOUNCE_TEST_APP_NAME=name, DEBOUNCE_TEST_CONN_MAX_AGE=conn_max_age)
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--poll-interval", "0.2", "--concurrency", "2")
        # Warm up: both job threads and the loop have used a connection.
        warm = [work.delay(f"warm-{i}", seconds=0.3).pk for i in range(2)]
        wait_for(_all_done(warm, worker), timeout=30, what="the warm-up jobs")
        # With CONN_MAX_AGE=0 the loop closes and reopens its connection every poll: keep
        # trying until the kill hits at least one backend instead of sampling one instant.
        killed = wait_for(
            lambda: pg_terminate(name), timeout=10, what="a worker backend to terminate"
        )
        wait_for(
            lambda: not set(killed) & {pid for pid, _ in pg_backends(name)},
            timeout=10,
            what="the terminated backends to go away",
        )
        jobs = [work.delay(f"after-{i}").pk for i in range(3)]
        wait_for(_all_done(jobs, worker), timeout=60, what="the jobs after the kill")
        assert worker.alive(), worker.tail()
        # With CONN_MAX_AGE=0 the loop closes and reopens its connection every poll, so
        # wait for a backend instead of sampling the one instant it may have none.
        after = wait_for(lambda: pg_backends(name), timeout=10, what="the worker's new backends")
        assert after, "the worker reconnected"
        assert not set(killed) & {pid for pid, _ in after}

        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()

    print(f"\n[b34 CONN_MAX_AGE={conn_max_age}] killed {len(killed)} backend(s)")
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 0
    assert DeadLetter.objects.count() == 0
    # No run was spent on a dead connection: each job ran once, first time.
    assert list(Job.objects.filter(pk__in=jobs).values_list("attempts", flat=True)) == [1, 1, 1]
    assert CallLog.objects.filter(key__startswith="after-").count() == 3


class Sampler(threading.Thread):
    """Count the worker's held backends every 0.5 s, noting how many jobs had run by then."""

    def __init__(self, name: str) -> None:
        super().__init__(name="pg-sampler", daemon=True)
        self.app = name
        self.stop = threading.Event()
        self.samples: list[tuple[int, int]] = []  # (jobs run so far, backends)
        self.pids: set[int] = set()  # every backend seen

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                done = CallLog.objects.filter(task="rel.one_query").count()
                first = {pid for pid, _ in pg_backends(self.app)}
                time.sleep(0.05)
                second = {pid for pid, _ in pg_backends(self.app)}
                self.pids.update(first | second)
                # A connection held, not one caught closing or opening: under CONN_MAX_AGE=0
                # each job thread reconnects per job (decision 66), and a backend whose client
                # just hung up is still listed for a moment beside its successor. A leaked
                # connection stays in both snapshots.
                self.samples.append((done, len(first & second)))
                self.stop.wait(0.5)
        finally:
            connections.close_all()


@pytest.mark.slow
@pytest.mark.parametrize("conn_max_age", ["0", "60"])
def test_b35_worker_connections_bounded(tmp_path, conn_max_age):
    concurrency, total = 8, 2000
    name = app_name("b35")
    for n in range(total):
        one_query.delay(n)
    env = child_env(DEBOUNCE_TEST_APP_NAME=name, DEBOUNCE_TEST_CONN_MAX_AGE=conn_max_age)
    sampler = Sampler(name)
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", str(concurrency), "--poll-interval", "0.1")
        sampler.start()
        started = time.monotonic()
        try:
            wait_for(
                lambda: (
                    CallLog.objects.filter(task="rel.one_query").count() == total
                    or not worker.alive()
                ),
                timeout=240,
                interval=0.2,
                what=f"{total} jobs",
            )
            drained = time.monotonic() - started
            assert worker.alive(), worker.tail()
            time.sleep(2.5)  # idle: a few polls after the drain
            idle = [len(pg_backends(name)) for _ in range(5) if not time.sleep(0.2)]
        finally:
            sampler.stop.set()
            sampler.join(10)
        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
    wait_for(lambda: not pg_backends(name), timeout=10, what="the worker's connections to close")

    busy = [count for done, count in sampler.samples if 0 < done < total]
    early = [count for done, count in sampler.samples if 0 < done <= 200]
    late = [count for done, count in sampler.samples if 200 < done]
    print(
        f"\n[b35 CONN_MAX_AGE={conn_max_age}] {total} jobs in {drained:.1f}s; "
        f"backends: max {max(count for _, count in sampler.samples)} over "
        f"{len(sampler.samples)} samples; up to 200 jobs max {max(early, default=0)}; "
        f"after 200 max {max(late, default=0)}; distinct backends seen {len(sampler.pids)}; "
        f"idle after the drain {idle}"
    )
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == total
    assert len(busy) >= 2 and late
    # Never more than one connection per job thread plus the loop's own, in every sample
    # from the first job to the 2,000th: no growth with the number of jobs run.
    assert max(count for _, count in sampler.samples) <= concurrency + 1
    if conn_max_age == "0":
        # At most the loop's connection (it closes and reopens it on every poll).
        assert max(idle) <= 1
    else:
        # Reused, never replaced: the same 9 backends served all 2,000 jobs.
        assert len(sampler.pids) <= concurrency + 1
        assert max(idle) <= concurrency + 1


def _sessions_opened() -> int:
    """PostgreSQL sessions (connections) opened in this database so far, as last flushed.

    A backend flushes its statistics when it exits, so read this after the worker exited.
    """
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # no cached snapshot
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("conn_max_age", ["0", "None"])
def test_busy_worker_keeps_its_loop_connection(tmp_path, conn_max_age):
    """A threaded burst opens one connection per job at most (decision 66), not one per claim.

    With ``CONN_MAX_AGE=0`` each job's connection (the task's, reused for its outcome)
    closes after the job, as Django closes a request's; the loop keeps its own for the
    claims while the worker is busy. Persistent connections serve the whole drain.
    """
    concurrency, total = 4, 200
    for n in range(total):
        one_query.delay(n)
    time.sleep(1.1)  # let this test's own backend flush its statistics (at most once a second)
    before = _sessions_opened()
    name = app_name("busy")
    env = child_env(DEBOUNCE_TEST_CONN_MAX_AGE=conn_max_age, DEBOUNCE_TEST_APP_NAME=name)
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--burst", "--concurrency", str(concurrency))
        assert worker.wait(120) == 0, worker.tail()
    # A backend flushes its last statistics as it exits, after the worker process is gone;
    # it leaves pg_stat_activity only after that flush: wait for all of them, then count.
    wait_for(lambda: not pg_backends(name), timeout=30, what="the worker's backends to exit")
    opened = _sessions_opened() - before
    print(f"\n[CONN_MAX_AGE={conn_max_age}] {total} jobs at C={concurrency}: {opened} sessions")
    assert CallLog.objects.filter(task="rel.one_query").count() == total
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == total
    if conn_max_age == "0":
        # One per job (its task's query and the outcome write share it), plus the loop's
        # and start-up's few (one of them the command's table check before the first claim,
        # decision 130). Reconnecting the loop for each claim made it ~1.5 per job.
        assert total <= opened <= total + 4
    else:
        assert opened <= concurrency + 3
