"""One lease keeper per process for runs it does not drive (the Celery executor, decision 183).

* a run that lasts past a third of its lease is renewed by the process's one thread,
  fenced on its worker id; a run that ended is not renewed again;
* runs of two worker ids at once are renewed, each under its own fence;
* a run far within its lease costs no statement and starts no thread.

Leases of a fraction of a second keep the renewals within the test's time.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.utils import timezone

from django_debounce.models import Job
from django_debounce.run.lease_keeper import ProcessLeaseKeeper
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = dt.timedelta(seconds=0.3)


def _running(worker_id: str) -> Job:
    return JobFactory(
        status=Job.Status.RUNNING,
        worker_id=worker_id,
        attempts=1,
        lease_expires_at=timezone.now() + LEASE,
    )


def _lease(job: Job) -> dt.datetime:
    return Job.objects.values_list("lease_expires_at", flat=True).get(pk=job.pk)


def _wait_for(condition, *, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the keeper did not renew in time"
        time.sleep(0.02)


def test_a_long_run_is_renewed_under_its_fence_until_it_ends() -> None:
    keeper = ProcessLeaseKeeper()
    mine, other = _running("celery:a"), _running("celery:b")
    first = _lease(mine)
    with keeper.holding(mine.pk, worker_id="celery:a", lease=LEASE, using="default"):
        assert keeper.held_ids() == [mine.pk]
        _wait_for(lambda: keeper.renewals >= 2)
        assert _lease(mine) > first, "renewed past the claim's lease"
    ended = _lease(mine)
    time.sleep(LEASE.total_seconds() * 0.7)  # two renewal periods: none for an ended run
    assert _lease(mine) == ended and keeper.held_ids() == []
    assert _lease(other) < ended, "another run's job is not this run's to renew"


def test_runs_of_two_worker_ids_are_each_renewed_and_a_stale_fence_renews_nothing() -> None:
    keeper = ProcessLeaseKeeper()
    a, b = _running("celery:a"), _running("celery:b")
    before = {job.pk: _lease(job) for job in (a, b)}
    reclaimed = _running("celery:someone-else")  # its run's worker id no longer holds it
    with (
        keeper.holding(a.pk, worker_id="celery:a", lease=LEASE, using="default"),
        keeper.holding(b.pk, worker_id="celery:b", lease=LEASE, using="default"),
        keeper.holding(reclaimed.pk, worker_id="celery:late", lease=LEASE, using="default"),
    ):
        _wait_for(lambda: all(_lease(job) > before[job.pk] for job in (a, b)))
        stale = _lease(reclaimed)
    assert _lease(reclaimed) <= stale + LEASE, "fenced: the late run's lease is not extended"
    assert Job.objects.get(pk=reclaimed.pk).worker_id == "celery:someone-else"


def test_short_runs_cost_no_statement_and_one_thread_at_most() -> None:
    keeper = ProcessLeaseKeeper()
    job = _running("celery:short")
    threads = threading.active_count()
    for _ in range(50):
        with keeper.holding(
            job.pk, worker_id="celery:short", lease=dt.timedelta(minutes=1), using="default"
        ):
            pass
    assert threading.active_count() <= threads + 1, "one keeper thread, not one per run"
    assert keeper.renewals == 0 and keeper.held_ids() == []
