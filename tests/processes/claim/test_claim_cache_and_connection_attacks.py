"""Attacks on the compiled claim cache (decision 65) and the worker's connection policy (66).

Kept as regression tests: each one tried to make the compiled queries disagree
with the ORM querysets they stand for, or to make the loop's kept connection
and the inline lease keeper lose, double-run or leak something.

- Seeded random tables (odd queue names, values equal to the compiler's
  sentinels, instants a microsecond apart): the compiled claim and its idle
  peek return exactly what :func:`claimable_jobs` returns through the ORM, and
  so do the gated claim's first candidate read and its lock of the jobs taken.
- Results of every JSON shape stored by the compiled success write are the
  bytes the ORM's ``update(result=…)`` stores.
- Eight threads claiming on a cold cache that is cleared every few entries
  (``MAX_ENTRIES`` lowered) claim each job once (PostgreSQL, MariaDB).
- PostgreSQL: the loop's connection terminated while jobs run, and retired by
  ``CONN_MAX_AGE`` while busy, loses and repeats nothing. PostgreSQL and
  MariaDB: the inline lease keeper renews a job longer than its lease, ends
  with every run, and a SIGTERM in an inline burst lets the running job finish.

Found broken and fixed: a server idle timeout killed the loop's kept connection
while busy (an ERROR and a 1 s stall per claim, even with ``CONN_HEALTH_CHECKS``;
now a connection unused for ``LOOP_RECHECK_AFTER`` is tested before use), and a
connection lost during the shutdown drain was never reopened, so the running
job's lease lapsed and it ran twice (now the drain closes it after a failed
renewal).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import signal
import threading
import time
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_debounce import compiled, task
from django_debounce.claim.claiming import _take_due, claim_jobs
from django_debounce.claim.gated import first_candidates
from django_debounce.claim.queries import ClaimShape, anything_claimable, lock_due
from django_debounce.flow.rules import claimable_jobs
from django_debounce.models import Job, JobDependency
from django_debounce.run.interrupts import WorkerExit
from django_debounce.run.outcomes import record_success
from django_debounce.run.storable import storable_result
from django_debounce.worker.loop import Worker
from tests.conftest import T, child_env, is_postgres
from tests.factories import JobFactory
from tests.procs import WorkerThread, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import work

KATHMANDU = ZoneInfo("Asia/Kathmandu")  # UTC+05:45
M = dt.timedelta(minutes=1)
US = dt.timedelta(microseconds=1)
LEASE = dt.timedelta(seconds=60)
Status = Job.Status

#: The instants compiled.py compiles with (slot 0, variants 0 and 1): real values equal to
#: them must still be bound as values, not mistaken for the placeholders' positions.
SENTINEL_0 = dt.datetime(1971, 2, 3, 4, 5, 6, 123457, tzinfo=dt.UTC)
SENTINEL_1 = dt.datetime(1972, 2, 3, 4, 5, 6, 123457, tzinfo=dt.UTC)

#: Queue names that look like SQL placeholders, quotes, the text sentinel, or (on SQLite,
#: where datetimes are bound as text) the datetime sentinel adapted.
ODD_QUEUES = [
    "a",
    "b",
    "",
    "%s",
    "%%s",
    "q'uote",
    "\x1fdebounce-slot-0-0",
    "1971-02-03 04:05:06.123457",
    "ünï",
]


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    compiled.clear()


def _lock_flavour() -> str:
    features = connection.features
    if features.has_select_for_update_skip_locked:
        return "skip_locked"
    return "for_update" if features.has_select_for_update else ""


def _seed_table(rng: random.Random, now: dt.datetime, count: int = 36) -> None:
    """Write ``count`` random jobs around ``now`` (and around the sentinels) with dependencies."""
    offsets = [-3 * M, -M, -US, dt.timedelta(0), US, M]
    jobs = []
    for _ in range(count):
        anchor = rng.choice([now, now, now, SENTINEL_0, SENTINEL_1])
        status = rng.choice([Status.READY] * 5 + [Status.RUNNING, Status.SUCCESSFUL, Status.FAILED])
        lease = None
        if status == Status.RUNNING:
            lease = rng.choice([None, anchor + rng.choice(offsets)])
        jobs.append(
            JobFactory(
                queue=rng.choice(ODD_QUEUES),
                status=status,
                run_at=anchor + rng.choice(offsets),
                key_hash=rng.choice([None, None, "k1", "k2", "k3"]),
                lease_expires_at=lease,
                priority=rng.choice([-1, 0, 0, 3]),
                created_at=now,
            )
        )
    for _ in range(count // 3):
        child, parent = rng.sample(jobs, 2)
        JobDependency.objects.get_or_create(job=child, dependency=parent)


def _orm(now: dt.datetime, queues: Any, busy: tuple[str, ...], limit: int) -> list[int]:
    qs = claimable_jobs(now, queues)
    if busy:
        qs = qs.exclude(queue__in=list(busy))
    return list(qs.values_list("pk", flat=True)[:limit])


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_claim_and_peek_equal_the_orm_on_random_tables(seed):
    """Every shape (queue order, list or tuple, busy sets, limits) at instants that equal a
    sentinel or sit a microsecond from the rows answers as the ORM does."""
    rng = random.Random(seed)
    _seed_table(rng, T)
    queue_sets: list[Any] = [
        None,
        [],
        ["a"],
        ["b", "a"],
        ("a", "b"),
        ["%s", "q'uote"],
        ["\x1fdebounce-slot-0-0"],
        ["1971-02-03 04:05:06.123457", ""],
        ["ünï", "%%s", "a"],
    ]
    # The same instants in another zone too: each is bound as the instant it is.
    nows = [T, T - US, T + US, SENTINEL_0, SENTINEL_1, SENTINEL_0 + US, T.astimezone(KATHMANDU)]
    lock = _lock_flavour()
    checked = nonempty = 0
    for queues in queue_sets:
        for busy in [(), ("a",), tuple(sorted(rng.sample(ODD_QUEUES, 3)))]:
            for limit in (1, 3, 50):
                shape = ClaimShape(queues=tuple(queues or ()), busy=busy, lock=lock)
                for now in nows:
                    with transaction.atomic():
                        got = [
                            job.pk
                            for job in _take_due(shape, limit=limit, now=now, using="default")
                        ]
                    want = _orm(now, queues, busy, limit)
                    assert got == want, (queues, busy, limit, now)
                    checked += 1
                    nonempty += bool(want)
        for now in nows:
            peeked = anything_claimable(now, queues, "default")
            assert peeked == claimable_jobs(now, queues).exists(), (queues, now)
    assert nonempty > checked // 4, "the random tables should have claimable jobs"


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [4, 5])
def test_compiled_gated_candidates_and_job_locks_equal_the_orm_on_random_tables(seed):
    """The gated claim's compiled pieces: its first unlocked candidates (names left out in
    the SQL) and the lock of the jobs it takes answer as the ORM does."""
    rng = random.Random(seed)
    _seed_table(rng, T)
    names = ["tests.noop", "%s", "q'uote", "\x1fdebounce-slot-0-0"]
    for job in Job.objects.all():
        Job.objects.filter(pk=job.pk).update(task_name=rng.choice(names))
    every = list(Job.objects.values_list("pk", flat=True))
    lock = _lock_flavour()
    nonempty = 0
    for queues in [(), ("a",), ("b", "%s")]:
        shape = ClaimShape(queues=queues, busy=(), lock=lock)
        unlocked = ClaimShape(queues=queues, busy=(), lock="")
        for skip in [(), ("%s",), ("q'uote", "tests.noop")]:
            for batch in (1, 9):
                for now in (T, T - US, SENTINEL_0):
                    got = [
                        job.pk for job in first_candidates(unlocked, skip, batch, now, "default")
                    ]
                    want = list(
                        claimable_jobs(now, queues)
                        .exclude(task_name__in=list(skip))
                        .values_list("pk", flat=True)[:batch]
                    )
                    assert got == want, (queues, skip, batch, now)
                    nonempty += bool(want)
        for now in (T, SENTINEL_1):
            ids = rng.sample(every, 5)
            with transaction.atomic():
                locked = set(lock_due(shape, ids, now, "default"))
            assert locked == set(
                claimable_jobs(now, queues).filter(pk__in=ids).values_list("pk", flat=True)
            )
    assert nonempty > 10, "the random tables should have claimable jobs"


@pytest.mark.django_db
def test_compiled_rows_equal_orm_rows_for_every_claimable_job():
    """Each job the compiled claim returns has every field as the ORM loads it."""
    _seed_table(random.Random(7), T, count=24)
    shape = ClaimShape(queues=(), busy=(), lock=_lock_flavour())
    with transaction.atomic():
        jobs = _take_due(shape, limit=100, now=T, using="default")
    assert jobs
    loaded = Job.objects.in_bulk([job.pk for job in jobs])
    for job in jobs:
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(loaded[job.pk], field.attname)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"level": i, "inner": [value]}
    return value


RESULTS: list[Any] = [
    None,
    "",
    "null",
    0,
    -1,
    2**53 + 1,
    2**63 - 1,
    2**70,
    1.5,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    True,
    [],
    {},
    {"": None},
    [None, [None], {"a": None}],
    "\x1fdebounce-slot-3-0",
    "\x1fdebounce-slot-3-1",
    "1971-02-03 04:05:06.123457",
    "%s",
    "%(result)s",
    "'; DROP TABLE django_debounce_job; --",
    "ünïcödé 🎉",
    "nul\x00inside",
    {"nul\x00key": "v\x00"},
    _nested(40),
    "x" * 100_000,
    {1, 2},
    dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
]


def _raw_result(pk: int) -> Any:
    with connection.cursor() as cursor:
        cast = "result::text" if is_postgres() else "result"
        cursor.execute(f"SELECT {cast} FROM django_debounce_job WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_the_compiled_success_write_stores_what_the_orm_stores(clock):
    """For results of every shape, the compiled fenced write and ``update(result=…)`` of the
    same stored form leave identical column text (jsonb text on PostgreSQL)."""
    for index, value in enumerate(RESULTS):
        mine = JobFactory(run_at=T - M, queue="mine")
        twin = JobFactory(run_at=T - M, queue="twin")
        [claimed] = claim_jobs(worker_id="w", limit=1, lease=LEASE, queues=["mine"])
        record_success(claimed, value, worker_id="w", using="default")
        Job.objects.filter(pk=twin.pk).update(result=storable_result(value))
        mine.refresh_from_db()
        twin.refresh_from_db()
        assert mine.status == Status.SUCCESSFUL, index
        assert mine.result == twin.result or (mine.result != mine.result), index  # NaN-safe
        assert _raw_result(mine.pk) == _raw_result(twin.pk), (index, value)
    assert len([k for k in compiled.cache_keys() if k[0] == ("record_success",)]) == 1


@pytest.mark.django_db
def test_a_job_due_exactly_at_the_sentinel_instant_is_claimed_with_its_own_values(clock):
    """Rows and clocks equal to the compiler's sentinels are ordinary values."""
    at = JobFactory(run_at=SENTINEL_0, queue="1971-02-03 04:05:06.123457").pk
    later = JobFactory(run_at=SENTINEL_1).pk
    clock(at=SENTINEL_0)
    assert [j.pk for j in claim_jobs(worker_id="w", limit=5, lease=LEASE, peek=True)] == [at]
    clock(at=SENTINEL_1 - US)
    assert claim_jobs(worker_id="w", limit=5, lease=LEASE, peek=True) == []
    clock(at=SENTINEL_1)
    [job] = claim_jobs(worker_id="\x1fdebounce-slot-1-0", limit=5, lease=LEASE)
    assert job.pk == later
    stored = Job.objects.get(pk=later)
    assert (stored.started_at, stored.lease_expires_at) == (SENTINEL_1, SENTINEL_1 + LEASE)
    assert stored.worker_id == "\x1fdebounce-slot-1-0"


@pytest.mark.django_db
def test_queue_order_and_container_type_claim_the_same_jobs(clock):
    ids = {q: JobFactory(run_at=T - M, queue=q).pk for q in ("a", "b", "c")}
    assert {j.pk for j in claim_jobs(worker_id="w", limit=5, lease=LEASE, queues=("b", "a"))} == {
        ids["a"],
        ids["b"],
    }
    JobFactory(run_at=T - M, queue="a")
    JobFactory(run_at=T - M, queue="b")
    got = claim_jobs(worker_id="w", limit=5, lease=LEASE, queues=["a", "b"])
    assert sorted(j.queue for j in got) == ["a", "b"]
    assert Job.objects.get(pk=ids["c"]).status == Status.READY


@pytest.mark.django_db
def test_the_cache_starting_over_mid_run_keeps_claims_right(clock, monkeypatch):
    """With ``MAX_ENTRIES`` = 2 every new shape clears the cache; claims stay correct."""
    monkeypatch.setattr(compiled, "MAX_ENTRIES", 2)
    for i in range(12):
        JobFactory(run_at=T - dt.timedelta(seconds=12 - i), queue="ab"[i % 2])
    claimed: list[int] = []
    for limit, queues in [(1, None), (2, ["a"]), (1, ["b"]), (3, None), (2, ["b", "a"]), (5, None)]:
        claimed += [
            j.pk for j in claim_jobs(worker_id="w", limit=limit, lease=LEASE, queues=queues)
        ]
        assert len(compiled.cache_keys()) <= 2
    assert len(claimed) == len(set(claimed)) == 12
    assert set(Job.objects.values_list("status", "attempts")) == {(Status.RUNNING, 1)}


# -- threads and connections (row locks; the connection kills are PostgreSQL-only) ---------


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_eight_threads_claiming_on_a_cold_cache_that_keeps_clearing(monkeypatch):
    """Eight claimers compile at once, through cache clears, and claim each job once."""
    monkeypatch.setattr(compiled, "MAX_ENTRIES", 3)
    now = timezone.now()
    total = 120
    for i in range(total):
        JobFactory(run_at=now - dt.timedelta(seconds=i), queue="abc"[i % 3], key_hash=None)
    barrier = threading.Barrier(8)
    claims: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        rng = random.Random(n)
        mine = claims.setdefault(f"w{n}", [])
        try:
            barrier.wait()
            misses = 0
            while misses < 3:
                queues = rng.choice([None, ["a"], ["b", "c"], ["c", "a"], ["a", "b", "c"]])
                got = claim_jobs(
                    worker_id=f"w{n}", limit=rng.randint(1, 6), lease=LEASE, queues=queues
                )
                mine.extend(job.pk for job in got)
                misses = 0 if got else misses + 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    everything = [pk for ids in claims.values() for pk in ids]
    assert len(everything) == len(set(everything)) == total
    for worker_id, ids in claims.items():
        assert set(
            Job.objects.filter(pk__in=ids).values_list("worker_id", "status", "attempts")
        ) <= {(worker_id, Status.RUNNING, 1)}


@task(name="attack.log_run")
def log_run(tag: str, seconds: float = 0.0) -> str:
    """Write a CallLog row for this run, then sleep ``seconds``."""
    CallLog.objects.create(
        task="attack.log_run", key=tag, payload={}, pid=0, started_at=timezone.now()
    )
    time.sleep(seconds)
    return tag


class _LoopWatcher(Worker):
    """A Worker that records the backend pid its loop thread claims on."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.loop_pids: list[int] = []

    def _claim(self, limit: int) -> list[Job]:
        jobs = super()._claim(limit)
        conn = connections[self.using]
        if conn.connection is not None and conn.vendor == "postgresql":
            pid = conn.connection.info.backend_pid
            if not self.loop_pids or self.loop_pids[-1] != pid:
                self.loop_pids.append(pid)
        return jobs


def _run_watched(**options: Any) -> tuple[_LoopWatcher, threading.Thread, list[BaseException]]:
    worker = _LoopWatcher(handle_signals=False, worker_id="watched", **options)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return worker, thread, errors


def _runs_per_tag(prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tag in CallLog.objects.filter(key__startswith=prefix).values_list("key", flat=True):
        counts[tag] = counts.get(tag, 0) + 1
    return counts


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_loop_connection_terminated_while_busy_loses_and_repeats_nothing():
    """pg_terminate_backend of the kept loop connection while jobs run: the loop reconnects,
    every job runs exactly once, first attempt (decision 66, B34 while busy)."""
    tags = [f"busy-{i}" for i in range(10)]
    jobs = [log_run.delay(tag, seconds=0.4).pk for tag in tags]
    worker, thread, errors = _run_watched(concurrency=2, poll_interval=0.1)
    try:
        wait_for(lambda: worker.loop_pids and worker._in_flight, timeout=20, what="busy loop")
        killed = []
        for _ in range(3):  # kill it a few times while the backlog drains
            pid = worker.loop_pids[-1]
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            killed.append(pid)
            wait_for(
                lambda pid=pid: worker.loop_pids[-1] != pid or not thread.is_alive(),
                timeout=20,
                what="the loop to reconnect",
            )
        wait_for(
            lambda: Job.objects.filter(pk__in=jobs, status=Status.SUCCESSFUL).count() == len(jobs),
            timeout=60,
            what="every job",
        )
    finally:
        worker.stop()
        thread.join(20)
    assert not errors, errors
    assert not thread.is_alive()
    assert set(killed).isdisjoint(worker.loop_pids[-1:])
    assert set(Job.objects.filter(pk__in=jobs).values_list("attempts", flat=True)) == {1}
    assert _runs_per_tag("busy-") == dict.fromkeys(tags, 1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_conn_max_age_retires_the_loop_connection_while_busy(monkeypatch):
    """CONN_MAX_AGE=1 with a worker busy for ~4 s: the loop's connection is replaced by age
    while jobs run (not only after an idle poll), and no job runs twice."""
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 1)
    connections["default"].close()
    tags = [f"aged-{i}" for i in range(16)]
    jobs = [log_run.delay(tag, seconds=0.5).pk for tag in tags]
    started = time.monotonic()
    # No prefetch: the loop claims for free threads only, so it claims (and uses its
    # connection) every ~0.25 s; a prefetching loop claims these 16 jobs in two claims.
    worker, thread, errors = _run_watched(concurrency=2, poll_interval=0.1, burst=True, prefetch=0)
    thread.join(60)
    elapsed = time.monotonic() - started
    assert not thread.is_alive() and not errors, errors
    assert Job.objects.filter(pk__in=jobs, status=Status.SUCCESSFUL).count() == len(jobs)
    assert _runs_per_tag("aged-") == dict.fromkeys(tags, 1)
    # ~4 s busy with a 1 s max age: replaced at least twice, at most once a second (not once
    # per claim: 16 jobs took 8 or more claims).
    assert 3 <= len(worker.loop_pids) <= elapsed + 2, (worker.loop_pids, elapsed)


def _keepers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "debounce-lease" and t.is_alive()]


@task(name="attack.interrupt")
def interrupt() -> None:
    """Raise KeyboardInterrupt inside the task: the run's own error (decision 150)."""
    raise KeyboardInterrupt


@task(name="attack.host_stop")
def host_stop() -> None:
    """The worker's second signal landing inside a job: it ends the run (decision 150)."""
    raise WorkerExit(1)


@task(name="attack.fail")
def fail() -> None:
    """Raise ValueError (a job that fails and is retried)."""
    raise ValueError("no")


@pytest.mark.django_db(transaction=True)
def test_inline_run_leaves_no_lease_keeper_behind_however_it_ends():
    """Returns normally, stops at max_jobs, finds nothing, a job raises (retried later), or a
    BaseException escapes a job: the keeper thread has ended when run() returns or raises."""
    before = len(_keepers())
    tags = [f"inline-{i}" for i in range(4)]
    for tag in tags:
        log_run.delay(tag)
    worker = Worker(burst=True, concurrency=1, max_jobs=3, handle_signals=False, worker_id="i")
    assert worker.run() == 3
    assert len(_keepers()) == before
    assert Worker(burst=True, handle_signals=False, worker_id="i").run() == 1
    assert len(_keepers()) == before
    assert Worker(burst=True, handle_signals=False, worker_id="i").run() == 0  # nothing due
    assert len(_keepers()) == before
    failing = fail.delay()
    assert Worker(burst=True, handle_signals=False, worker_id="i").run() == 1
    failing.refresh_from_db()
    assert (failing.status, failing.attempts, failing.error) == (Status.READY, 1, "ValueError: no")
    assert len(_keepers()) == before
    interrupted = interrupt.delay()
    assert Worker(burst=True, handle_signals=False, worker_id="i").run() == 1
    interrupted.refresh_from_db()
    assert (interrupted.status, interrupted.attempts) == (Status.READY, 1)  # a failure, retried
    assert interrupted.error.startswith("KeyboardInterrupt")
    assert len(_keepers()) == before
    job = host_stop.delay()
    with pytest.raises(WorkerExit):
        Worker(burst=True, handle_signals=False, worker_id="i").run()
    assert len(_keepers()) == before
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RUNNING, 1)  # its lease lapses: rerun later
    assert _runs_per_tag("inline-") == dict.fromkeys(tags, 1)


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_inline_job_longer_than_its_lease_is_never_taken_by_another_worker():
    """Lease 1.5 s, a job of 4 s runs inline while a threaded worker polls the same queue
    and reclaims lapsed leases every poll: the job runs once, on the inline worker.

    (Renewed every 0.5 s, the lease lapses only if a renewal is 1 s late; with a 0.6 s lease a
    0.4 s stall of a loaded machine was enough for the rival to take the job.)"""
    lease = dt.timedelta(seconds=1.5)
    tags = ["long-0"]
    jobs = [log_run.delay(tag, seconds=4.0).pk for tag in tags]
    inline = WorkerThread("inline", lease=lease, burst=True, concurrency=1).start()
    wait_for(lambda: Job.objects.filter(status=Status.RUNNING).exists(), timeout=30)
    rival = WorkerThread("rival", lease=lease, concurrency=2, poll_interval=0.05).start()
    try:
        inline.thread.join(30)
        assert not inline.alive()
    finally:
        rival.stop()
        inline.stop()
    assert inline.worker.processed == 1 and rival.worker.processed == 0
    assert set(Job.objects.filter(pk__in=jobs).values_list("status", "attempts", "worker_id")) == {
        (Status.SUCCESSFUL, 1, "inline")
    }
    assert _runs_per_tag("long-") == dict.fromkeys(tags, 1)
    assert not _keepers()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_sigterm_during_an_inline_burst_finishes_the_running_job_only(tmp_path):
    """``--burst`` at concurrency 1 (one lease keeper) gets SIGTERM mid-job: the job
    finishes and is recorded, the rest stay READY, the process exits 0."""
    # 4 s: the SIGTERM must land while job 0 runs, or the burst goes on to job 1.
    jobs = [work.delay(f"term-{i}", seconds=4.0).pk for i in range(3)]
    with processes(tmp_path, child_env(DEBOUNCE_TEST_LEASE="1s")) as procs:
        proc = procs.worker("--burst", "--concurrency", "1")
        wait_for(
            lambda: CallLog.objects.filter(key="term-0").exists(), timeout=30, what="job 0 start"
        )
        proc.send(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.tail()
    statuses = dict(Job.objects.filter(pk__in=jobs).values_list("pk", "status"))
    assert statuses == {
        jobs[0]: Status.SUCCESSFUL,
        jobs[1]: Status.READY,
        jobs[2]: Status.READY,
    }
    assert Job.objects.get(pk=jobs[0]).attempts == 1
    assert list(CallLog.objects.filter(key__startswith="term-").values_list("key", flat=True)) == [
        "term-0"
    ]


@task(name="attack.nap")
def nap(seconds: float) -> None:
    """Sleep ``seconds`` without touching the database."""
    time.sleep(seconds)


class _Records:
    """Collects the ``action`` of each record the worker's logger emits."""

    def __init__(self) -> None:
        self.actions: list[str] = []

    def handle(self, record: Any) -> bool:
        self.actions.append(getattr(record, "action", ""))
        return False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("max_age", "health_checks"),
    [(0, False), (600, True)],
)
def test_a_server_idle_timeout_while_busy_costs_no_loop_error(monkeypatch, max_age, health_checks):
    """PostgreSQL closes sessions idle for 1.5 s; jobs of 2.5 s keep a threaded worker busy.
    The loop's connection idles through each job: it must be replaced before use, not fail.

    The timeout is above ``LOOP_RECHECK_AFTER`` (1 s), the idle time from which the loop tests
    its connection: with 0.4 s, two jobs ending 0.2–0.8 s apart (a loaded machine) left the
    loop an idle gap the server had closed but the loop did not test, and the test failed."""
    settings_dict = connections["default"].settings_dict
    options = {**settings_dict.get("OPTIONS", {}), "options": "-c idle_session_timeout=1500"}
    monkeypatch.setitem(settings_dict, "OPTIONS", options)
    monkeypatch.setitem(settings_dict, "CONN_MAX_AGE", max_age)
    monkeypatch.setitem(settings_dict, "CONN_HEALTH_CHECKS", health_checks)
    connections["default"].close()
    jobs = [nap.delay(2.5).pk for _ in range(4)]
    records = _Records()
    logger = logging.getLogger("django_debounce.worker")
    logger.addFilter(records.handle)
    try:
        worker, thread, errors = _run_watched(concurrency=2, poll_interval=0.1, burst=True)
        thread.join(60)
    finally:
        logger.removeFilter(records.handle)
        monkeypatch.undo()  # before the database teardown, which needs a live connection
        connections["default"].close()
    assert not thread.is_alive() and not errors, errors
    assert Job.objects.filter(pk__in=jobs, status=Status.SUCCESSFUL).count() == 4
    assert records.actions.count("db_error") == 0, records.actions


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_loop_connection_killed_over_and_over_during_a_drain():
    """The loop's backend is terminated every 10–80 ms while 200 short jobs drain at
    concurrency 4 (kills land in claims, renewals, the reclaim check): every job runs once."""
    tags = [f"storm-{i}" for i in range(200)]
    # 0.1 s jobs: a prefetching loop claims ~20 jobs at a time (issue #12), so the drain must
    # last ~7 s for the kills (aimed at the backend of its last claim) to land 20 times.
    jobs = [log_run.delay(tag, seconds=0.15).pk for tag in tags]
    worker, thread, errors = _run_watched(concurrency=4, poll_interval=0.05)
    rng = random.Random(5)
    kills = 0
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            done = Job.objects.filter(pk__in=jobs, status=Status.SUCCESSFUL).count()
            if done == len(jobs):
                break
            if worker.loop_pids:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [worker.loop_pids[-1]])
                    kills += bool(cursor.fetchone()[0])
            time.sleep(rng.uniform(0.01, 0.08))
    finally:
        worker.stop()
        thread.join(20)
    assert not errors, errors
    print(f"\n{kills} kills, {len(set(worker.loop_pids))} loop backends")
    statuses = dict(Job.objects.filter(pk__in=jobs).values_list("pk", "status"))
    assert set(statuses.values()) == {Status.SUCCESSFUL}, statuses
    assert kills >= 20
    assert set(Job.objects.filter(pk__in=jobs).values_list("attempts", flat=True)) == {1}
    assert _runs_per_tag("storm-") == dict.fromkeys(tags, 1)


@pytest.mark.django_db(transaction=True)
def test_eight_job_threads_on_a_cache_that_holds_one_entry(monkeypatch):
    """``--concurrency 8`` from a cold cache whose every new shape clears it (``MAX_ENTRIES``
    = 1): the job threads compile the success write at once while the loop recompiles its
    claim each poll; every job runs once and stores its result."""
    monkeypatch.setattr(compiled, "MAX_ENTRIES", 1)
    tags = [f"cold-{i}" for i in range(48)]
    jobs = [log_run.delay(tag, seconds=0.05).pk for tag in tags]
    worker, thread, errors = _run_watched(concurrency=8, poll_interval=0.05, burst=True)
    thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert worker.processed == len(jobs)
    stored = dict(Job.objects.filter(pk__in=jobs).values_list("pk", "result"))
    assert stored == dict(zip(jobs, tags, strict=True))
    assert set(Job.objects.filter(pk__in=jobs).values_list("status", "attempts")) == {
        (Status.SUCCESSFUL, 1)
    }
    assert _runs_per_tag("cold-") == dict.fromkeys(tags, 1)
    assert len(compiled.cache_keys()) <= 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_loop_connection_lost_during_the_shutdown_drain_keeps_renewing():
    """SIGTERM-like stop() with a 5 s job running (lease 3 s, grace 10 s), then the loop's
    backend is terminated: the drain must keep the lease alive, so a rival polling with
    reclaim never reruns the job.

    The drain renews every third of the lease: the renewal after the kill fails and the next
    one reconnects, about two thirds of a lease after the stop. With a 1.2 s lease that left
    0.1–0.3 s for the reconnection, too little on a loaded machine; 3 s leaves about 1 s."""
    lease = dt.timedelta(seconds=3)
    job = log_run.delay("drain-0", seconds=5.0)
    worker, thread, errors = _run_watched(
        concurrency=1, poll_interval=0.05, lease=lease, shutdown_grace=dt.timedelta(seconds=10)
    )
    rival = None
    try:
        wait_for(lambda: worker.loop_pids and worker._in_flight, timeout=20, what="job running")
        worker.stop()  # the loop enters its drain: it only renews the running job's lease
        time.sleep(0.05)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [worker.loop_pids[-1]])
        rival = WorkerThread("rival", lease=lease, concurrency=1, poll_interval=0.05).start()
        thread.join(20)
        time.sleep(0.5)  # a rerun started by the rival has written its CallLog row by now
    finally:
        if rival is not None:
            rival.stop()
        worker.stop()
        thread.join(20)
    assert not errors, errors
    job.refresh_from_db()
    assert _runs_per_tag("drain-") == {"drain-0": 1}
    assert (job.status, job.attempts, job.worker_id) == (Status.SUCCESSFUL, 1, "watched")
