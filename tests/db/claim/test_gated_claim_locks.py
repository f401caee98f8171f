"""A gated claim locks only the jobs it takes (issue #8, item 4; decision 43).

As soon as one registered task has flow control, every claim goes through the
admission gate. It reads its candidates without row locks, lets the gate
decide, then locks exactly the jobs it takes (to run, shed or expire). These
tests hold one claim's transaction open on a connection of its own and check
that a second claim still finds the due jobs the first did not take, and that
a taken job found locked elsewhere is passed over without being waited for and
without costing a token or the breaker's probe. PostgreSQL only: SQLite
serialises claims, so it cannot show a race.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections, transaction

from django_debounce import CircuitBreaker, registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import DeadLetter, Job, TaskState
from tests.conftest import T
from tests.factories import JobFactory
from tests.procs import in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE = dt.timedelta(seconds=60)
READY, RUNNING, SHED = Job.Status.READY, Job.Status.RUNNING, Job.Status.SHED


def _noop(*args: Any) -> None: ...


@contextmanager
def registered(name: str, **options: Any) -> Iterator[None]:
    task(name=name, **options)(_noop)
    try:
        yield
    finally:
        registry.unregister(name)


@contextmanager
def held_open(work: Callable[[], Any]) -> Iterator[Any]:
    """Run ``work`` in a transaction on a connection of its own; keep it open for the block.

    Yields what ``work`` returned; the transaction commits when the block ends.
    """
    done, release = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            with transaction.atomic():
                box["value"] = work()
                done.set()
                release.wait(60)
        except BaseException as exc:  # surfaced in the test's thread
            box["error"] = exc
        finally:
            done.set()
            connections.close_all()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        assert done.wait(60), "the held transaction never got going"
        if "error" in box:
            raise box["error"]
        yield box["value"]
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]


def claim(worker_id: str, limit: int) -> list[int]:
    return [job.pk for job in claim_jobs(worker_id=worker_id, limit=limit, lease=LEASE)]


def lock_rows(*ids: int) -> Callable[[], list[int]]:
    """What an enqueue sliding these jobs' windows holds: their row locks."""
    return lambda: list(
        Job.objects.select_for_update().filter(pk__in=ids).values_list("pk", flat=True)
    )


def lockable_ready() -> list[int]:
    """READY jobs nobody holds a row lock on right now, by id."""
    with transaction.atomic():
        return list(
            Job.objects.select_for_update(skip_locked=True)
            .filter(status=READY)
            .order_by("pk")
            .values_list("pk", flat=True)
        )


@pytest.mark.parametrize("due", [2, 5, 9])
def test_a_second_claim_finds_a_job_while_a_gated_claim_is_open(due):
    """The issue's case: an unrelated task's rate limit turns the gate on; with 2–9 due
    jobs the first claim locked them all, so a second worker came back empty."""
    ids = [JobFactory(args=[i]).pk for i in range(due)]
    with registered("gc.limited", rate_limit="5/s"):
        with held_open(lambda: claim("first", 1)) as first:
            assert first == ids[:1]
            assert claim("second", 1) == ids[1:2]
            assert lockable_ready() == ids[2:]  # nothing examined but not taken stays locked
    rows = dict(Job.objects.values_list("pk", "worker_id"))
    assert rows == {ids[0]: "first", ids[1]: "second", **dict.fromkeys(ids[2:], "")}
    assert (
        list(
            Job.objects.filter(status=READY, attempts=0).order_by("pk").values_list("pk", flat=True)
        )
        == ids[2:]
    )


def test_a_job_locked_elsewhere_is_passed_over_and_costs_no_token(clock):
    with registered("gc.rate", rate_limit="3/m"):  # capacity 3, full at T
        ids = [JobFactory(task_name="gc.rate", args=[i], run_at=T).pk for i in range(5)]
        with held_open(lock_rows(ids[0])):
            assert in_thread(lambda: claim("w1", 2)) == ids[1:3]
            assert TaskState.objects.get(task_name="gc.rate").tokens == 1.0
        assert claim("w2", 5) == ids[:1]  # the one token left
        assert TaskState.objects.get(task_name="gc.rate").tokens == 0.0
    assert (
        list(Job.objects.filter(status=RUNNING).order_by("pk").values_list("pk", flat=True))
        == ids[:3]
    )


def test_a_probe_locked_elsewhere_passes_the_probe_to_the_next_job(clock):
    with registered("gc.guarded", circuit_breaker=CircuitBreaker(failures=1, reset="1m")):
        TaskState.objects.create(
            task_name="gc.guarded", breaker_state="open", failures=1, opened_at=T - 2 * LEASE
        )
        ids = [JobFactory(task_name="gc.guarded", args=[i], run_at=T).pk for i in range(3)]
        with held_open(lock_rows(ids[0])):
            assert in_thread(lambda: claim("w", 3)) == ids[1:2]
    state = TaskState.objects.get(task_name="gc.guarded")
    assert (state.breaker_state, state.probe_job_id) == ("half_open", ids[1])


def test_a_job_to_shed_that_is_locked_elsewhere_is_neither_shed_nor_waited_for(clock):
    with registered("gc.drop", rate_limit="1/m", on_excess="drop"):
        ids = [JobFactory(task_name="gc.drop", args=[i], run_at=T).pk for i in range(4)]
        with held_open(lock_rows(ids[2])):
            assert in_thread(lambda: claim("w", 5), timeout=30) == ids[:1]
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert statuses == {ids[0]: RUNNING, ids[1]: SHED, ids[2]: READY, ids[3]: SHED}
    assert sorted(DeadLetter.objects.values_list("job_id", flat=True)) == [ids[1], ids[3]]


def test_an_expired_job_locked_elsewhere_is_left_for_later_without_waiting(clock):
    with registered("gc.limited", rate_limit="5/s"):
        stale = JobFactory(run_at=T - LEASE, expires_at=T - LEASE / 2).pk
        fresh = JobFactory(run_at=T).pk
        with held_open(lock_rows(stale)):
            assert in_thread(lambda: claim("w", 2), timeout=30) == [fresh]
        assert Job.objects.get(pk=stale).status == READY
        assert claim("w", 2) == []  # now it is expired, never run
    assert Job.objects.get(pk=stale).status == Job.Status.EXPIRED
