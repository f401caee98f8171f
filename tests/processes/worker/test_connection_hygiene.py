"""Connection hygiene of a worker subprocess on PostgreSQL (issue #18 item 5).

Extends ``test_worker_connections.py`` (reconnects after ``pg_terminate_backend``
with health checks off, N + 1 connections at one worker × 8 threads over 2,000
jobs) with what a server does to a long-lived worker on its own:

- ``idle_session_timeout`` (PostgreSQL 14+), set per session through the child's
  libpq options (``DEBOUNCE_TEST_PG_OPTIONS``; never server-wide), ends the
  connections of an idle worker; work enqueued after it runs once, first attempt,
  with nothing logged as an error, and the worker is never ``idle in transaction``
  while it waits (``idle_in_transaction_session_timeout`` set too).
- ``CONN_HEALTH_CHECKS = True``: a connection terminated while the worker idles is
  replaced before use, with either wake-up (LISTEN/NOTIFY or polling).
- Two workers × 4 threads over 10,000 jobs: never more server connections than the
  documented ``threads + 1`` per worker (plus the listener's own), and no growth with
  the number of jobs run (slow).

Found broken and fixed (decision 173): a listening worker's loop ignored
``CONN_HEALTH_CHECKS`` (the claim after an outside termination failed, logged an
ERROR and backed off for 1 s), and the LISTEN connection, idle by design, was ended by
every ``idle_session_timeout`` (a WARNING and a reconnect each time).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection, connections

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import Proc, app_name, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import one_query, work

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

#: The server ends sessions idle (or idle in a transaction) for 1.5 s: above the loop's
#: LOOP_RECHECK_AFTER (1 s), and the worker polls every second (it must not matter).
TIMEOUTS = "-c idle_session_timeout=1500 -c idle_in_transaction_session_timeout=1500"
DB_ERROR = "database error in the worker loop"
LISTENER_LOST = "wake-up lost"


def _backends(name: str) -> list[tuple[int, str, str]]:
    """(pid, application_name, state) of the worker's backends, its listener's included."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, coalesce(state, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name IN (%s, %s)",
            [name, f"{name}:wakeup"],
        )
        return [(int(pid), str(app), str(state)) for pid, app, state in cursor.fetchall()]


def _django_pids(name: str) -> set[int]:
    return {pid for pid, app, _ in _backends(name) if app == name}


def _terminate_idle(name: str) -> list[int]:
    """Terminate the worker's Django connections that are idle now (not its listener's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND state = 'idle'",
            [name],
        )
        return [int(pid) for pid, terminated in cursor.fetchall() if terminated]


def _done(ids: list[int], worker: Proc):
    def check() -> bool:
        assert worker.alive(), worker.tail()
        return Job.objects.filter(pk__in=ids, status=Job.Status.SUCCESSFUL).count() == len(ids)

    return check


def _ran_once(prefix: str, ids: list[int]) -> None:
    assert list(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == [1] * len(ids)
    keys = sorted(CallLog.objects.filter(key__startswith=prefix).values_list("key", flat=True))
    assert keys == sorted(f"{prefix}{i}" for i in range(len(ids)))


def _stop(worker: Proc) -> str:
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.tail()
    log = worker.stderr()
    assert "Traceback" not in log, worker.tail()
    return log


@pytest.mark.parametrize(
    ("wakeup", "poll", "health_checks"),
    [("notify", "1", "0"), ("poll", "1", "0"), ("notify", "3", "0"), ("poll", "3", "1")],
)
def test_a_worker_idle_past_idle_session_timeout_runs_new_work_once(
    tmp_path, wakeup, poll, health_checks
):
    """Persistent connections (``CONN_MAX_AGE=None``): the server ends the job threads'
    idle connections (and, polling every 3 s, the loop's); jobs enqueued after that run
    once, first attempt, nothing is logged as an error, and the LISTEN connection is not
    ended over and over.

    The loop's connection survives a poll shorter than the timeout; a longer wait is
    covered by the loop's recheck of a connection unused for 1 s while listening, and by
    ``CONN_HEALTH_CHECKS`` while polling. Polling slower than the timeout without health
    checks, the first claim after each timeout fails instead (``database error in the
    worker loop``, a reconnect after 1 s; no job is affected): docs/reference/commands.md."""
    name = app_name("idle")
    env = child_env(
        DEBOUNCE_TEST_APP_NAME=name,
        DEBOUNCE_TEST_CONN_MAX_AGE="None",
        DEBOUNCE_TEST_CONN_HEALTH_CHECKS=health_checks,
        DEBOUNCE_TEST_PG_OPTIONS=TIMEOUTS,
        DEBOUNCE_TEST_WAKEUP=wakeup,
    )
    ended = 2 if poll == "1" else 3  # the job threads' (and the loop's) connections
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", poll)
        warm = [work.delay(f"warm-{i}", seconds=0.3).pk for i in range(2)]
        wait_for(_done(warm, worker), timeout=30, what="the warm-up jobs")
        first = _backends(name)
        warm_pids = {pid for pid, app, _ in first if app == name}
        listeners = {pid for pid, app, _ in first if app != name}
        assert len(warm_pids) == 3, first  # the loop's and both job threads' (kept: None)
        states: set[str] = set()

        def timed_out() -> bool:
            assert worker.alive(), worker.tail()
            states.update(state for _, _, state in _backends(name))
            # Connections idle past the timeout: the server ends them.
            return len(warm_pids - _django_pids(name)) >= ended

        wait_for(timed_out, timeout=20, interval=0.05, what=lambda: f"timeouts\n{worker.tail()}")
        # A few more seconds idle: more timeouts would have passed (every 1.5 s).
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            states.update(state for _, _, state in _backends(name))
            time.sleep(0.05)
        after = _backends(name)
        jobs = [work.delay(f"after-{i}").pk for i in range(3)]
        wait_for(_done(jobs, worker), timeout=30, what="the jobs after the timeouts")
        log = _stop(worker)
    print(
        f"\n[idle_session_timeout, {wakeup}, poll {poll}s] backends warm {first}, idle {after}; states {states}"
    )
    assert states <= {"idle", "active"}, states  # never "idle in transaction" while waiting
    _ran_once("after-", jobs)
    assert DB_ERROR not in log, log
    if wakeup == "notify":
        assert len(listeners) == 1, first
        # The listener exempts its own session from the timeout (decision 173).
        assert listeners <= {pid for pid, _, _ in after}, (first, after)
        assert LISTENER_LOST not in log, log


@pytest.mark.parametrize("wakeup", ["notify", "poll"])
def test_health_checks_replace_a_connection_terminated_while_idle(tmp_path, wakeup):
    """``CONN_MAX_AGE=None`` with ``CONN_HEALTH_CHECKS=True``: every Django connection of an
    idle worker is terminated from outside; the next poll replaces the loop's (no ERROR, no
    back-off), each job thread replaces its own, and each job runs once, first attempt.

    The poll interval (0.5 s) is below the loop's 1 s recheck of an unused connection, so
    only the health check can find the loop's dead connection. With health checks off
    the first claim fails instead: ``database error in the worker loop``, a reconnect
    after 1 s, no job affected (``test_b34_worker_reconnects``)."""
    name = app_name("health")
    env = child_env(
        DEBOUNCE_TEST_APP_NAME=name,
        DEBOUNCE_TEST_CONN_MAX_AGE="None",
        DEBOUNCE_TEST_CONN_HEALTH_CHECKS="1",
        DEBOUNCE_TEST_WAKEUP=wakeup,
    )
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--concurrency", "2", "--poll-interval", "0.5")
        warm = [work.delay(f"warm-{i}", seconds=0.3).pk for i in range(2)]
        wait_for(_done(warm, worker), timeout=30, what="the warm-up jobs")
        warm_pids = wait_for(
            lambda: pids if len(pids := _django_pids(name)) == 3 else None,
            timeout=10,
            what="the loop's and the job threads' connections",
        )
        killed: set[int] = set()

        def all_killed() -> bool:
            # Only idle backends, so no kill lands inside a claim statement.
            killed.update(_terminate_idle(name))
            return warm_pids <= killed

        wait_for(all_killed, timeout=10, interval=0.02, what="every connection terminated")
        wait_for(lambda: not killed & _django_pids(name), timeout=10, what="the backends to exit")
        time.sleep(1.2)  # a few polls on the replaced loop connection
        jobs = [work.delay(f"after-{i}").pk for i in range(4)]
        wait_for(_done(jobs, worker), timeout=30, what="the jobs after the kill")
        log = _stop(worker)
    _ran_once("after-", jobs)
    assert DB_ERROR not in log, log


class _Sampler(threading.Thread):
    """Count each worker's backends every 0.2 s, with the number of jobs run by then."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(name="pg-sampler", daemon=True)
        self.names = names
        self.stop = threading.Event()
        # (jobs run so far, {app name: Django backends}, {app name: listener backends})
        self.samples: list[tuple[int, dict[str, int], dict[str, int]]] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                done = CallLog.objects.filter(task="rel.one_query").count()
                django, listen = dict.fromkeys(self.names, 0), dict.fromkeys(self.names, 0)
                for name in self.names:
                    for _, app, _ in _backends(name):
                        (django if app == name else listen)[name] += 1
                self.samples.append((done, django, listen))
                self.stop.wait(0.2)
        finally:
            connections.close_all()


def _sessions_opened() -> int:
    """Sessions opened in this database so far (flushed by a backend at its exit)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


@pytest.mark.slow
def test_two_workers_of_four_threads_stay_within_their_connections_over_10000_jobs(tmp_path):
    """10,000 one-query jobs, two workers at ``--concurrency 4`` with the recommended
    settings (``CONN_MAX_AGE=600``, health checks, LISTEN/NOTIFY): per worker never more
    than 4 + 1 Django connections (docs/reference/commands.md) plus one listener, in every
    sample from the first job to the last, and the same sessions serve the whole run."""
    threads, total = 4, 10_000
    names = [app_name(f"bound{i}") for i in range(2)]
    one_query.delay_many([(n,) for n in range(total)])
    time.sleep(1.1)  # this test's own backend flushes its statistics (at most once a second)
    sessions_before = _sessions_opened()
    sampler = _Sampler(names)
    with processes(tmp_path, child_env()) as procs:
        workers = [
            procs.worker(
                "--concurrency",
                str(threads),
                name=f"worker-{i}",
                env={
                    "DEBOUNCE_TEST_APP_NAME": name,
                    "DEBOUNCE_TEST_CONN_MAX_AGE": "600",
                    "DEBOUNCE_TEST_CONN_HEALTH_CHECKS": "1",
                },
            )
            for i, name in enumerate(names)
        ]
        sampler.start()
        started = time.monotonic()
        try:

            def drained() -> bool:
                for worker in workers:
                    assert worker.alive(), worker.tail()
                return CallLog.objects.filter(task="rel.one_query").count() >= total

            wait_for(drained, timeout=240, interval=0.5, what=f"{total} jobs")
            took = time.monotonic() - started
        finally:
            sampler.stop.set()
            sampler.join(10)
        for worker in workers:
            _stop(worker)
    wait_for(
        lambda: not any(_backends(name) for name in names),
        timeout=30,
        what="the workers' backends to exit",
    )
    opened = _sessions_opened() - sessions_before
    busy = [s for s in sampler.samples if 0 < s[0] < total]
    per_worker = max(max(django.values()) for _, django, _ in sampler.samples)
    listeners = max(max(listen.values()) for _, _, listen in sampler.samples)
    totals = [(done, sum(django.values()) + sum(listen.values())) for done, django, listen in busy]
    early = max((count for done, count in totals if done <= 1000), default=0)
    late = max((count for done, count in totals if done > 1000), default=0)
    print(
        f"\n[2 workers x {threads} threads] {total} jobs in {took:.1f}s, "
        f"{len(sampler.samples)} samples: Django connections per worker max {per_worker}, "
        f"listeners per worker max {listeners}; all backends max {early} up to 1,000 jobs, "
        f"{late} after; sessions opened {opened}"
    )
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == total
    assert CallLog.objects.filter(task="rel.one_query").count() == total  # each job once
    assert len(busy) >= 5 and any(done > 1000 for done, _ in totals), sampler.samples[:5]
    assert per_worker <= threads + 1
    assert listeners <= 1
    assert late <= 2 * (threads + 2)
    # The same sessions serve every job: per worker its threads', its loop's, its listener's,
    # and the command's start-up check (decision 130); nothing grows with the job count.
    assert opened <= 2 * (threads + 4), opened
