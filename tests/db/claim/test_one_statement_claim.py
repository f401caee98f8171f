"""The one-statement claim on PostgreSQL (decision 67 in docs/decisions.md).

Outside a transaction, with no gated task and no CoDel queue served, a claim is
one autocommit statement (``WITH picked AS (… FOR UPDATE SKIP LOCKED) UPDATE …
RETURNING``). These tests check it is taken, that it claims what the
transactional claim would (order, queues, limit, one job per key, dependencies),
that an expired due job still ends EXPIRED with its dependents cancelled and
never runs, and that a gated task or a CoDel queue keeps the transactional
claim. PostgreSQL only; each test commits (``transaction=True``), since the fast
path is never taken inside an atomic block.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_debounce import compiled, registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow.rules import claimable_jobs
from django_debounce.models import DeadLetter, Job, JobDependency
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE = dt.timedelta(seconds=60)
S = dt.timedelta(seconds=1)
Status = Job.Status


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    compiled.clear()


def claim(limit: int, queues: list[str] | None = None, worker_id: str = "w") -> list[Job]:
    return claim_jobs(worker_id=worker_id, limit=limit, lease=LEASE, queues=queues)


def claim_counted(limit: int, queues: list[str] | None = None) -> tuple[list[Job], list[str]]:
    """Claim, returning the jobs and the SQL of every statement the claim sent.

    The first claim of a shape compiles its SQL inside an empty atomic block (Django
    compiles ``select_for_update()`` only in a transaction): Django logs ``BEGIN`` and
    ``COMMIT`` for it though nothing reaches the server. Count warm claims.
    """
    with CaptureQueriesContext(connection) as ctx:
        jobs = claim(limit, queues)
    return jobs, [query["sql"] for query in ctx.captured_queries]


def oneshot_keys() -> list[Any]:
    return [key for key, _alias, _vendor in compiled.cache_keys() if key[0] == "claim_oneshot"]  # type: ignore[misc]


def test_fast_path_is_one_autocommit_statement_returning_running_jobs(clock):
    assert claim(5) == []  # compiles the shape
    first = JobFactory(run_at=T - 2 * S).pk
    second = JobFactory(run_at=T - S).pk
    assert connection.get_autocommit() and not connection.in_atomic_block
    jobs, statements = claim_counted(5)
    assert len(statements) == 1, statements
    assert statements[0].startswith("WITH picked")
    assert "FOR UPDATE SKIP LOCKED" in statements[0]
    assert [job.pk for job in jobs] == [first, second]
    for job in jobs:
        assert job.status == Status.RUNNING
        assert job.worker_id == "w"
        assert job.attempts == 1
        assert job.started_at == T
        assert job.lease_expires_at == T + LEASE
        assert job.window_key is None
        stored = Job.objects.get(pk=job.pk)
        assert [getattr(stored, f.attname) for f in Job._meta.concrete_fields] == [
            getattr(job, f.attname) for f in Job._meta.concrete_fields
        ]
        assert job._state.db == "default" and not job._state.adding
    assert len(oneshot_keys()) == 1
    # Nothing left: still one statement, nothing claimed.
    jobs, statements = claim_counted(5)
    assert (jobs, len(statements)) == ([], 1)


def test_claim_order_priority_then_run_at_then_id(clock):
    plain = [JobFactory(run_at=T - dt.timedelta(seconds=10 - i)).pk for i in range(4)]
    tie = JobFactory(run_at=T - 10 * S).pk  # same run_at as plain[0], higher id
    high = JobFactory(run_at=T, priority=5).pk
    low = JobFactory(run_at=T - 60 * S, priority=-1).pk
    expected = [high, plain[0], tie, *plain[1:], low]
    assert expected[:7] == [job.pk for job in claimable_jobs(T)][:7]
    assert [job.pk for job in claim(3)] == expected[:3]
    assert [job.pk for job in claim(10)] == expected[3:]


def test_queues_filter_and_limit(clock):
    a = [JobFactory(queue="a", run_at=T - dt.timedelta(seconds=9 - i)).pk for i in range(3)]
    b = JobFactory(queue="b", run_at=T - 20 * S).pk
    c = JobFactory(queue="c", run_at=T - 30 * S).pk
    later = JobFactory(queue="a", run_at=T + S).pk  # not due yet
    assert [job.pk for job in claim(2, ["a"])] == a[:2]
    assert [job.pk for job in claim(5, ["b", "a"])] == [b, a[2]]
    assert claim(5, ["a", "b"]) == []
    assert [job.pk for job in claim(5)] == [c]
    assert Job.objects.get(pk=later).status == Status.READY
    assert Job.objects.filter(status=Status.RUNNING).count() == 5


def test_two_jobs_of_one_key_are_never_both_claimed(clock):
    first = JobFactory(key_hash="k", run_at=T - 2 * S).pk
    second = JobFactory(key_hash="k", run_at=T - S).pk
    other = JobFactory(key_hash="other", run_at=T - S).pk
    assert sorted(job.pk for job in claim(10)) == sorted([first, other])
    assert claim(10) == []  # first runs under a live lease: second waits
    Job.objects.filter(pk=first).update(status=Status.SUCCESSFUL, lease_expires_at=None)
    assert [job.pk for job in claim(10)] == [second]


def test_a_job_waits_for_its_dependency(clock):
    head = JobFactory(run_at=T - S).pk
    tail = JobFactory(run_at=T - 2 * S).pk
    JobDependency.objects.create(job_id=tail, dependency_id=head)
    assert [job.pk for job in claim(10)] == [head]
    Job.objects.filter(pk=head).update(status=Status.SUCCESSFUL)
    assert [job.pk for job in claim(10)] == [tail]


def test_an_expired_due_job_ends_expired_with_dependents_cancelled_never_claimed(clock):
    fresh = JobFactory(run_at=T - 3 * S).pk
    stale = JobFactory(run_at=T - 2 * S, expires_at=T - S).pk
    dependent = JobFactory(run_at=T - 5 * S).pk
    JobDependency.objects.create(job_id=dependent, dependency_id=stale)
    at_expiry = JobFactory(run_at=T - S, expires_at=T).pk  # expires_at <= now: expired too
    later = JobFactory(run_at=T - S, expires_at=T + S).pk
    jobs = claim(10)
    assert [job.pk for job in jobs] == [fresh, later]
    for pk in (stale, at_expiry):
        row = Job.objects.get(pk=pk)
        assert (row.status, row.attempts, row.started_at, row.finished_at) == (
            Status.EXPIRED,
            0,
            None,
            T,
        )
    assert Job.objects.get(pk=dependent).status == Status.CANCELLED
    assert not DeadLetter.objects.exists()
    assert claim(10) == []


def test_an_expired_job_alone_is_expired_and_nothing_claimed(clock):
    stale = JobFactory(run_at=T - 2 * S, expires_at=T - S).pk
    assert claim(1) == []
    assert Job.objects.get(pk=stale).status == Status.EXPIRED


def test_the_fast_statement_claims_nothing_when_a_picked_job_is_expired(clock):
    # The fallback must find every picked job still READY: the fast statement left them all.
    assert claim(10) == []  # compiles the shape
    fresh = JobFactory(run_at=T - 3 * S).pk
    stale = JobFactory(run_at=T - 2 * S, expires_at=T - S).pk
    jobs, statements = claim_counted(10)
    assert [job.pk for job in jobs] == [fresh]
    assert statements[0].startswith("WITH picked")
    assert len(statements) > 1  # the transactional claim ran after it
    assert Job.objects.get(pk=fresh).attempts == 1
    assert Job.objects.get(pk=stale).status == Status.EXPIRED


def _noop() -> None: ...


def test_a_gated_task_keeps_the_transactional_claim(clock):
    gated = task(name="oneshot.gated", rate_limit="100/s")(_noop)
    try:
        JobFactory(run_at=T - S, task_name=gated.name)
        JobFactory(run_at=T - S)
        jobs, statements = claim_counted(10)
    finally:
        registry.unregister(gated.name)
    assert len(jobs) == 2
    assert not any(sql.startswith("WITH picked") for sql in statements)
    assert oneshot_keys() == []


def test_a_codel_queue_keeps_the_transactional_claim(clock, settings):
    settings.DEBOUNCE_QUEUES = {"slow": {"codel": {"target": "1s", "interval": "10s"}}}
    a = JobFactory(queue="fast", run_at=T - S).pk
    b = JobFactory(queue="slow", run_at=T - S).pk
    # Every queue (includes "slow") or a served CoDel queue: the transaction.
    for queues, expected in ((None, [a, b]), (["slow"], [])):
        jobs, statements = claim_counted(10, queues)
        assert [job.pk for job in jobs] == expected
        assert not any(sql.startswith("WITH picked") for sql in statements)
    # Only queues without CoDel: one statement.
    assert claim(10, ["fast"]) == []  # compiles the shape
    JobFactory(queue="fast", run_at=T - S)
    jobs, statements = claim_counted(10, ["fast"])
    assert len(jobs) == 1 and len(statements) == 1


def test_inside_an_atomic_block_the_transactional_claim_runs(clock):
    pk = JobFactory(run_at=T - S).pk
    with transaction.atomic():
        jobs, statements = claim_counted(10)
    assert [job.pk for job in jobs] == [pk]
    assert not any(sql.startswith("WITH picked") for sql in statements)


def test_two_claimers_split_a_backlog_without_overlap(clock):
    # Different connections (threads): SKIP LOCKED lets each take its own rows.
    ids = {JobFactory(run_at=T - S).pk for _ in range(40)}
    got: dict[str, list[int]] = {}

    def drain(worker_id: str) -> None:
        try:
            mine: list[int] = []
            while batch := claim(3, worker_id=worker_id):
                mine.extend(job.pk for job in batch)
            got[worker_id] = mine
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [pk for mine in got.values() for pk in mine]
    assert sorted(claimed) == sorted(ids)
    assert Job.objects.filter(status=Status.RUNNING, attempts=1).count() == 40
