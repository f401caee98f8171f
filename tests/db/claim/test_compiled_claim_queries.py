"""The compiled claim queries (django_debounce.compiled): same jobs as the ORM, keyed by shape.

The claim's SQL is compiled once per (queues, busy queues, limit, lock flavour,
alias, vendor) and run again with a new ``now``; these tests check that every
shape returns what the ORM queryset :func:`claimable_jobs` returns, that a
changing clock reuses an entry and still answers for its own instant, and that
rows come back converted exactly as the ORM loads them. They run on SQLite and
on PostgreSQL (``python3 dev.py test --db postgres``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection, transaction

from django_debounce import compiled
from django_debounce.claim.claiming import _take_due, claim_jobs
from django_debounce.claim.queries import ClaimShape
from django_debounce.flow.rules import claimable_jobs
from django_debounce.models import Job, JobDependency
from django_debounce.run.outcomes import record_success
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

LEASE = dt.timedelta(seconds=60)
M = dt.timedelta(minutes=1)


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    compiled.clear()


def claim(limit: int, queues: list[str] | None = None, **options: Any) -> list[int]:
    return [
        job.pk
        for job in claim_jobs(worker_id="w", limit=limit, lease=LEASE, queues=queues, **options)
    ]


def orm_claimable(now: dt.datetime, queues: list[str] | None = None, limit: int = 100) -> list[int]:
    return list(claimable_jobs(now, queues).values_list("pk", flat=True)[:limit])


def shapes(kind: str) -> list[Any]:
    """Return the shapes (key without alias and vendor) of the cached ``kind`` entries."""
    found = []
    for key, alias, vendor in compiled.cache_keys():  # type: ignore[misc]
        assert (alias, vendor) == ("default", connection.vendor)
        if key[0] == kind:
            found.append(key[1:])
    return found


def test_queue_sets_each_claim_their_own_jobs(clock):
    a1 = JobFactory(queue="a", run_at=T - M).pk
    b1 = JobFactory(queue="b", run_at=T - M).pk
    c1 = JobFactory(queue="c", run_at=T - M).pk
    a2 = JobFactory(queue="a", run_at=T).pk
    assert claim(10, ["b"]) == [b1]
    assert claim(10, ["a"]) == [a1, a2]
    assert claim(10, ["a", "b"]) == []
    assert claim(10) == [c1]
    queue_sets = {shape[0].queues for shape in shapes("claim")}
    assert queue_sets == {("a",), ("b",), ("a", "b"), ()}


def test_each_limit_has_its_own_entry_and_claims_that_many_in_order(clock):
    ids = [JobFactory(run_at=T - dt.timedelta(seconds=10 - i)).pk for i in range(6)]
    high = JobFactory(run_at=T, priority=5).pk
    assert claim(1) == [high]
    assert claim(2) == ids[:2]
    assert claim(3) == ids[2:5]
    assert claim(2) == ids[5:]  # the limit-2 entry again
    assert sorted(shape[1] for shape in shapes("claim")) == [1, 2, 3]
    assert Job.objects.filter(status=Job.Status.RUNNING).count() == 7


def test_a_moving_clock_reuses_the_entry_and_claims_by_its_own_now(clock):
    soon = JobFactory(run_at=T + M).pk
    later = JobFactory(run_at=T + 2 * M).pk
    assert claim(5) == []
    assert claim(5, peek=True) == []
    clock(minutes=1)
    assert claim(5, peek=True) == [soon]
    clock(minutes=2)
    assert claim(5) == [later]
    assert len(shapes("claim")) == 1
    assert len(shapes("peek")) == 1
    job = Job.objects.get(pk=later)
    assert job.started_at == T + 2 * M
    assert job.lease_expires_at == T + 2 * M + LEASE


def test_a_live_lease_of_the_key_holds_a_job_back_until_it_lapses(clock):
    JobFactory(key_hash="k", status=Job.Status.RUNNING, worker_id="other", lease_expires_at=T + M)
    waiting = JobFactory(key_hash="k", run_at=T - M).pk
    assert claim(5) == []
    clock(seconds=59)
    assert claim(5) == []
    clock(minutes=1)  # lease_expires_at > now is false at the instant itself
    assert claim(5) == [waiting]


def test_compiled_claim_matches_the_orm_queryset_on_a_mixed_table(clock):
    """Keys due ahead, live and lapsed leases, dependencies, priorities, queues, the future."""
    JobFactory(queue="a", run_at=T - 3 * M, key_hash="k1")
    JobFactory(queue="a", run_at=T - 2 * M, key_hash="k1")  # behind the first of k1
    JobFactory(queue="b", run_at=T - M, key_hash="k2", priority=3)
    JobFactory(key_hash="k3", status=Job.Status.RUNNING, lease_expires_at=T + M)
    JobFactory(run_at=T - M, key_hash="k3")  # held by a live lease
    JobFactory(key_hash="k4", status=Job.Status.RUNNING, lease_expires_at=T - M)
    JobFactory(run_at=T - M, key_hash="k4")  # the lease lapsed
    parent = JobFactory(run_at=T + M)
    child = JobFactory(run_at=T - M)
    JobDependency.objects.create(job=child, dependency=parent)
    done = JobFactory(status=Job.Status.SUCCESSFUL)
    free = JobFactory(run_at=T - M, queue="b")
    JobDependency.objects.create(job=free, dependency=done)
    JobFactory(run_at=T + M)
    JobFactory(run_at=T - M, status=Job.Status.FAILED)
    for queues in (None, ["a"], ["b"], ["a", "b"]):
        for limit in (1, 2, 10):
            shape = ClaimShape(queues=tuple(queues or ()), busy=(), lock="")
            with transaction.atomic():
                got = [job.pk for job in _take_due(shape, limit=limit, now=T, using="default")]
            assert got == orm_claimable(T, queues, limit), (queues, limit)
    assert orm_claimable(T)  # the table has claimable jobs at all


def test_busy_queues_are_left_out_and_keyed(clock):
    a = JobFactory(queue="a", run_at=T - M).pk
    b = JobFactory(queue="b", run_at=T - M).pk
    with transaction.atomic():
        shape = ClaimShape(queues=(), busy=("a",), lock="")
        assert [job.pk for job in _take_due(shape, limit=5, now=T, using="default")] == [b]
        shape = ClaimShape(queues=(), busy=("b",), lock="")
        assert [job.pk for job in _take_due(shape, limit=5, now=T, using="default")] == [a]
    assert {shape[0].busy for shape in shapes("claim")} == {("a",), ("b",)}


def test_claimed_rows_equal_rows_loaded_by_the_orm(clock):
    job = JobFactory(
        run_at=T - M,
        args=[1, "two", {"three": [3.5, None]}],
        kwargs={"k": "ünïcode", "n": None},
        metadata={"source": "test"},
        expires_at=T + dt.timedelta(days=1),
        opened_at=T - 2 * M,
        max_run_at=T + M,
        debounce_key="key:1",
        key_hash="h" * 64,
        window_key="h" * 64,
        priority=-7,
    )
    [claimed] = claim_jobs(worker_id="w", limit=1, lease=LEASE)
    loaded = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(loaded, field.attname), field.attname
    assert claimed._state.db == "default"
    assert not claimed._state.adding


def test_the_claim_update_is_compiled_per_batch_size(clock):
    for _ in range(5):
        JobFactory(run_at=T - M)
    assert len(claim(2)) == 2
    assert len(claim(2)) == 2
    assert len(claim(2)) == 1  # a short batch: the one-id UPDATE
    assert sorted(shape[0] for shape in shapes("mark_running")) == [1, 2]
    assert set(Job.objects.values_list("attempts", "worker_id", "window_key")) == {(1, "w", None)}


@pytest.mark.parametrize(
    ("returns", "stored"),
    [(None, None), ("text", "text"), ({"a": [1, 2]}, {"a": [1, 2]}), ({1, 2}, "{1, 2}")],
)
def test_the_success_write_stores_the_result(clock, returns, stored):
    job = JobFactory(run_at=T - M)
    [claimed] = claim_jobs(worker_id="w", limit=1, lease=LEASE)
    record_success(claimed, returns, worker_id="w", using="default")
    job.refresh_from_db()
    assert (job.status, job.result, job.finished_at) == (Job.Status.SUCCESSFUL, stored, T)
    assert job.lease_expires_at is None and job.unique_lock is None


def test_the_success_write_is_fenced_on_worker_and_attempt(clock):
    job = JobFactory(run_at=T - M)
    [claimed] = claim_jobs(worker_id="w", limit=1, lease=LEASE)
    Job.objects.filter(pk=job.pk).update(worker_id="other", attempts=2)  # reclaimed meanwhile
    record_success(claimed, "late", worker_id="w", using="default")
    job.refresh_from_db()
    assert (job.status, job.result, job.worker_id) == (Job.Status.RUNNING, None, "other")


def test_a_query_using_a_slot_beyond_a_parameter_is_refused():
    run_at = Job._meta.get_field("run_at")

    def shifted(slot: Any) -> Any:  # the parameter is now + 1 s, not now
        return Job.objects.filter(run_at__lte=slot["now"] + dt.timedelta(seconds=1)).query

    with pytest.raises(compiled.NotCacheableError):
        compiled.compiled(("test", "shifted"), shifted, {"now": run_at}, "default")

    def shaped(slot: Any) -> Any:  # the SQL itself depends on the value
        now = slot["now"]
        return Job.objects.filter(run_at__lte=now)[: now.year % 7 + 1].query

    with pytest.raises(compiled.NotCacheableError):
        compiled.compiled(("test", "shaped"), shaped, {"now": run_at}, "default")
    assert compiled.cache_keys() == []


def test_the_key_names_the_alias_and_the_vendor(clock):
    JobFactory(run_at=T - M)
    claim(1)
    assert compiled.cache_keys()
    for _key, alias, vendor in compiled.cache_keys():  # type: ignore[misc]
        assert (alias, vendor) == ("default", connection.vendor)
