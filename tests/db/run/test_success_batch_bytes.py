"""Batched successes are bounded by bytes, and a refused batch is split (issue #17 item 8).

Decision 151. On MariaDB a batch of 500 large results was one ``UPDATE`` past the
server's ``max_allowed_packet``: the server dropped the connection (error 2006,
taken as transient) and the same batch was retried forever (after 90 s, 6 of 200
jobs were SUCCESSFUL). Now a batch carries at most a byte budget of results (4 MiB,
less on a server with a small packet, ``batch_budget.max_batch_bytes``), and a batch
the database refuses while it still answers is written in halves; a single result
it never takes is stored as its short ``repr``.

The MariaDB tests lower the server's GLOBAL ``max_allowed_packet`` (its SESSION value
is read-only) for a connection they open, and restore it at once: the server is shared.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_debounce import enqueue
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import DeadLetter, Job
from django_debounce.run import batch_budget
from django_debounce.run.storable import storable_result
from django_debounce.run.success_batches import SuccessBatch
from django_debounce.worker.loop import Worker

Status = Job.Status
LEASE = dt.timedelta(seconds=60)
KB = 1024
MIB = 1024 * KB

#: MariaDB/MySQL's max_allowed_packet; the other cells deselect the marker (.ci/run).
mariadb = pytest.mark.mariadb


def _job_updates(ctx: CaptureQueriesContext) -> int:
    return sum(
        1
        for q in ctx.captured_queries
        if q["sql"].startswith("UPDATE") and "SUCCESSFUL" in q["sql"].split("WHERE")[0]
    )


def _claimed_with(results: list[object]) -> list[tuple[Job, object]]:
    jobs = [enqueue("st.returns", args=[i]) for i in range(len(results))]
    claimed = claim_jobs(worker_id="w", limit=len(jobs), lease=LEASE)
    assert [job.pk for job in claimed] == [job.pk for job in jobs]
    return list(zip(claimed, results, strict=True))


def _batch(**options: object) -> SuccessBatch:
    return SuccessBatch(
        worker_id="w",
        using="default",
        interval=60.0,
        retry_for=LEASE,
        **options,  # type: ignore[arg-type]
    )


def _results(jobs: list[Job]) -> list[tuple[str, object]]:
    rows = Job.objects.in_bulk([job.pk for job in jobs])
    return [(rows[job.pk].status, rows[job.pk].result) for job in jobs]


@pytest.mark.django_db
def test_a_batch_is_bounded_by_bytes_as_well_as_rows(clock):
    results = [{"n": i, "text": str(i) * (40 * KB)} for i in range(6)]  # ~40 KB of JSON each
    pairs = _claimed_with(results)
    batch = _batch(max_bytes=100 * KB)
    for job, value in pairs:
        batch.add(job, storable_result(value), value)
    assert batch.seconds_until_due() == 0.0  # 240 KB pending: past the budget, due now
    with CaptureQueriesContext(connection) as ctx:
        assert batch.flush() == 6
    assert _job_updates(ctx) == 3  # two results (~80 KB) per statement
    assert _results([job for job, _ in pairs]) == [(Status.SUCCESSFUL, r) for r in results]
    assert len(batch) == 0 and batch.seconds_until_due() is None


@pytest.mark.django_db
def test_a_result_past_the_budget_is_written_alone(clock):
    results = ["small", "x" * (300 * KB), "small too"]
    pairs = _claimed_with(results)
    batch = _batch(max_bytes=100 * KB)
    for job, value in pairs:
        batch.add(job, storable_result(value), value)
    with CaptureQueriesContext(connection) as ctx:
        assert batch.flush() == 3
    assert _job_updates(ctx) == 3
    assert _results([job for job, _ in pairs]) == [(Status.SUCCESSFUL, r) for r in results]


@pytest.mark.django_db
def test_small_batches_never_ask_the_server_for_its_packet(clock, monkeypatch):
    monkeypatch.setattr(batch_budget, "_packets", {})
    pairs = _claimed_with([{"n": i} for i in range(20)])
    batch = _batch()
    for job, value in pairs:
        batch.add(job, value, value)
    with CaptureQueriesContext(connection) as ctx:
        assert batch.flush() == 20
    assert [q["sql"] for q in ctx.captured_queries if "max_allowed_packet" in q["sql"]] == []
    assert batch_budget._packets == {}


# -- a batch the database refuses ---------------------------------------------------------

POISON = "poison-for-the-test-trigger"


@pytest.fixture
def refuse_poison() -> Iterator[None]:
    """Make the database refuse (for good, not as a lost connection) an UPDATE storing POISON."""
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION sb_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF NEW.result::text LIKE '%{POISON}%' THEN RAISE EXCEPTION 'refused' "
                "USING ERRCODE = 'program_limit_exceeded'; END IF; RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER sb_refuse BEFORE UPDATE ON django_debounce_job "
                "FOR EACH ROW EXECUTE FUNCTION sb_refuse()"
            )
        elif vendor == "mysql":
            cursor.execute(
                "CREATE TRIGGER sb_refuse BEFORE UPDATE ON django_debounce_job FOR EACH ROW "
                f"BEGIN IF NEW.result LIKE '%{POISON}%' THEN SIGNAL SQLSTATE '45000' "
                "SET MESSAGE_TEXT = 'refused'; END IF; END"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER sb_refuse BEFORE UPDATE ON django_debounce_job FOR EACH ROW "
                f"WHEN NEW.result LIKE '%{POISON}%' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
    yield
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS sb_refuse ON django_debounce_job")
            cursor.execute("DROP FUNCTION IF EXISTS sb_refuse()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS sb_refuse")


@pytest.mark.django_db(transaction=True)
def test_a_refused_batch_is_split_until_the_refused_result_is_alone(refuse_poison, caplog):
    results: list[object] = [{"n": i} for i in range(8)]
    results[5] = {"n": 5, "note": POISON}
    pairs = _claimed_with(results)
    batch = _batch()
    for job, value in pairs:
        batch.add(job, storable_result(value), value)
    with caplog.at_level(logging.WARNING, logger="django_debounce"):
        batch.flush()
    jobs = [job for job, _ in pairs]
    outcomes = _results(jobs)
    assert [outcomes[i] for i in range(8) if i != 5] == [
        (Status.SUCCESSFUL, {"n": i}) for i in range(8) if i != 5
    ]
    # Its result and its short repr both refused: FAILED with the dead letter naming why (§7).
    assert outcomes[5] == (Status.FAILED, None)
    letter = DeadLetter.objects.get(job=jobs[5].pk)
    assert letter.metadata == {"attempts": 1, "unstorable": "result"}
    halves = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "batch_refused"]
    # 8 -> 4 + 4, the second 4 -> 2 + 2, the first 2 -> 1 + 1.
    assert [m.split(" (")[0] for m in halves] == [
        "the database refused a batch of 8 successes",
        "the database refused a batch of 4 successes",
        "the database refused a batch of 2 successes",
    ]
    assert len(batch) == 0


# -- MariaDB's max_allowed_packet ----------------------------------------------------------


def _set_global_packet(size: int) -> None:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SET GLOBAL max_allowed_packet = {int(size)}")
    finally:
        other.close()


def _global_packet() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@global.max_allowed_packet")
        return int(cursor.fetchone()[0])


@contextmanager
def packet_of(size: int, *, hold: bool) -> Iterator[None]:
    """Reconnect the test's connection under a ``max_allowed_packet`` of ``size`` bytes.

    ``hold``: keep the smaller GLOBAL value through the block, so that reconnects in it
    get it too; otherwise it is restored as soon as the connection is open.
    """
    original = _global_packet()
    _set_global_packet(size)
    try:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@session.max_allowed_packet")
            assert int(cursor.fetchone()[0]) == size
        if not hold:
            _set_global_packet(original)
        yield
    finally:
        _set_global_packet(original)


@mariadb
@pytest.mark.django_db(transaction=True)
def test_the_budget_follows_a_small_max_allowed_packet_and_no_statement_is_refused(
    monkeypatch, caplog
):
    monkeypatch.setattr(batch_budget, "_packets", {})
    results = [f"{i}:" + "r" * (300 * KB) for i in range(8)]  # 2.4 MB in all
    pairs = _claimed_with(results)
    # retry_for: a statement refused as a lost connection (2006) would be retried, not split.
    batch = SuccessBatch(
        worker_id="w", using="default", interval=60.0, retry_for=dt.timedelta(seconds=2)
    )
    with packet_of(MIB, hold=False):
        for job, value in pairs:
            batch.add(job, storable_result(value), value)
        with caplog.at_level(logging.WARNING, logger="django_debounce"):
            assert batch.flush() == 8
    assert batch_budget.max_batch_bytes("default") == MIB // 3
    assert _results([job for job, _ in pairs]) == [(Status.SUCCESSFUL, r) for r in results]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@mariadb
@pytest.mark.django_db(transaction=True)
def test_a_batch_past_max_allowed_packet_is_split_not_retried_forever(caplog):
    # ~8 MB against a 1 MiB packet: the server drops the connection (error 2006).
    results = [f"{i}:" + "p" * (800 * KB) for i in range(10)]
    pairs = _claimed_with(results)
    batch = SuccessBatch(
        worker_id="w",
        using="default",
        interval=60.0,
        retry_for=dt.timedelta(seconds=2),
        max_bytes=64 * MIB,  # as if the budget were read from a larger packet
    )
    for job, value in pairs:
        batch.add(job, storable_result(value), value)
    with packet_of(MIB, hold=True), caplog.at_level(logging.WARNING, logger="django_debounce"):
        assert batch.flush() == 10
    assert _results([job for job, _ in pairs]) == [(Status.SUCCESSFUL, r) for r in results]
    refused = [r for r in caplog.records if getattr(r, "action", "") == "batch_refused"]
    assert refused and refused[0].getMessage().startswith(
        "the database refused a batch of 10 successes"
    )


@mariadb
@pytest.mark.django_db(transaction=True)
def test_a_result_the_packet_never_takes_is_stored_as_its_short_repr(settings, caplog):
    settings.DEBOUNCE_MAX_PAYLOAD_BYTES = 4 * MIB
    big = "x" * (int(1.5 * MIB))  # one row larger than the 1 MiB packet
    pairs = _claimed_with([{"ok": 1}, big, {"ok": 3}])
    batch = SuccessBatch(
        worker_id="w",
        using="default",
        interval=60.0,
        retry_for=dt.timedelta(seconds=2),
        max_bytes=64 * MIB,
    )
    for job, value in pairs:
        batch.add(job, storable_result(value), value)
    with packet_of(MIB, hold=True), caplog.at_level(logging.WARNING, logger="django_debounce"):
        assert batch.flush() == 3
    jobs = [job for job, _ in pairs]
    assert _results(jobs) == [
        (Status.SUCCESSFUL, {"ok": 1}),
        (Status.SUCCESSFUL, "'" + "x" * 4997 + "..." + "x" * 4998 + "'"),
        (Status.SUCCESSFUL, {"ok": 3}),
    ]
    assert Job.objects.get(pk=jobs[1].pk).attempts == 1
    assert not DeadLetter.objects.exists()


@mariadb
@pytest.mark.django_db(transaction=True)
def test_a_worker_drains_large_results_under_a_small_packet(monkeypatch, settings):
    monkeypatch.setattr(batch_budget, "_packets", {})
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 60  # every success waits for the last flush
    # 10 distinct results of 800 KB: one 8 MB statement the server drops (2006), retried
    # forever before (equal results would be written as one shared value).
    texts = [f"{i}:" + "x" * (800 * KB) for i in range(10)]
    jobs = [enqueue("st.returns", args=[text]) for text in texts]
    with packet_of(MIB, hold=True):  # a reconnect does not get a larger packet either
        worker = Worker(burst=True, handle_signals=False, lease=dt.timedelta(seconds=5))
        worker._successes.retry_for = dt.timedelta(seconds=2)  # fail fast if it is retried
        assert worker.run() == 10
    assert _results(jobs) == [(Status.SUCCESSFUL, text) for text in texts]
