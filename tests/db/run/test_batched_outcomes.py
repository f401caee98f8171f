"""Draining in batches (issue #12 item 2): prefetched claims and successes written together.

* A batch of successes is ONE ``UPDATE`` (statements counted), each job with its own
  result and finish time; ``job_finished`` is sent once per job, after the write.
* The write is fenced per run (§11): a job reclaimed before the flush is not overwritten.
* A worker prefetches once a claim came back full; the jobs it claimed ahead count
  against concurrency caps and rate limits like running ones (§6), and their leases
  are renewed with the running jobs' (§7).
* Failures are written at once, exactly as without batching.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import registry
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import Job
from django_debounce.run.success_batches import SuccessBatch
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.testapp import tasks_flow
from tests.testapp.tasks_reliability import work
from tests.testapp.tasks_worker import fail_times

pytestmark = pytest.mark.django_db

LEASE = dt.timedelta(seconds=60)
READY, RUNNING, SUCCESSFUL = Job.Status.READY, Job.Status.RUNNING, Job.Status.SUCCESSFUL


def _job_updates(ctx: CaptureQueriesContext) -> list[str]:
    """The UPDATE statements on the job table among the captured queries."""
    return [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith("UPDATE") and "django_debounce_job" in q["sql"].split("SET")[0]
    ]


def _batch(worker_id: str = "w", interval: float = 60.0) -> SuccessBatch:
    return SuccessBatch(worker_id=worker_id, using="default", interval=interval, retry_for=LEASE)


def test_a_batch_of_successes_is_one_statement_with_each_jobs_result(clock, signal_log):
    jobs = [work.delay(f"t{i}") for i in range(5)]
    claimed = claim_jobs(worker_id="w", limit=10, lease=LEASE)
    assert [job.pk for job in claimed] == [job.pk for job in jobs]
    batch = _batch()
    for i, job in enumerate(claimed):
        clock(seconds=i + 1)
        batch.add(job, {"n": i}, {"n": i})
    signal_log.clear()
    with CaptureQueriesContext(connection) as ctx:
        assert batch.flush() == 5
    statements = [q["sql"] for q in ctx.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 1  # every job hit: no follow-up query
    assert len(_job_updates(ctx)) == 1
    rows = {job.pk: job for job in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert [(rows[j.pk].status, rows[j.pk].result) for j in jobs] == [
        (SUCCESSFUL, {"n": i}) for i in range(5)
    ]
    assert [rows[j.pk].finished_at for j in jobs] == [
        T + dt.timedelta(seconds=i + 1) for i in range(5)
    ]
    assert all(rows[j.pk].lease_expires_at is None for j in jobs)
    assert [
        (name, kwargs["job"].pk, kwargs["status"], status) for name, kwargs, status in signal_log
    ] == [("job_finished", j.pk, SUCCESSFUL, SUCCESSFUL) for j in jobs]
    assert len(batch) == 0


def test_a_batch_of_none_results_is_written_as_one_plain_value(clock):
    """Every no-op returned None: no CASE (a NULL-only CASE would not type as JSON)."""
    jobs = [work.delay(f"t{i}") for i in range(3)]
    batch = _batch()
    for job in claim_jobs(worker_id="w", limit=10, lease=LEASE):
        batch.add(job, None, None)
    with CaptureQueriesContext(connection) as ctx:
        assert batch.flush() == 3
    (sql,) = _job_updates(ctx)
    assert "CASE" not in sql  # one result (None) and, under the frozen clock, one finish time
    assert (
        list(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", "result"))
        == [(SUCCESSFUL, None)] * 3
    )


def test_the_fence_keeps_a_reclaimed_job_from_being_overwritten(clock, signal_log, caplog):
    first, second = work.delay("first"), work.delay("second")
    claimed = claim_jobs(worker_id="w", limit=2, lease=LEASE)
    batch = _batch()
    for job in claimed:
        batch.add(job, "late", "late")
    # The first run's lease lapsed and another worker took the job meanwhile (attempt 2).
    Job.objects.filter(pk=first.pk).update(worker_id="other", attempts=2)
    signal_log.clear()
    with caplog.at_level(logging.WARNING, logger="django_debounce.worker"):
        assert batch.flush() == 1
    reclaimed = Job.objects.get(pk=first.pk)
    assert (reclaimed.status, reclaimed.worker_id, reclaimed.result) == (RUNNING, "other", None)
    done = Job.objects.get(pk=second.pk)
    assert (done.status, done.result) == (SUCCESSFUL, "late")
    assert [(name, kwargs["job"].pk) for name, kwargs, _ in signal_log] == [
        ("job_finished", second.pk)
    ]
    assert f"job {first.pk} (rel.work): this run no longer holds the job" in caplog.text


def test_a_worker_burst_writes_its_successes_in_one_statement(settings):
    """30 jobs, prefetch 10, no flush by time: claims of 1, 11, 11, 7 and ONE success UPDATE."""
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 60
    jobs = [work.delay(f"t{i}") for i in range(30)]
    worker = Worker(burst=True, prefetch=10, handle_signals=False, worker_id="w")
    with CaptureQueriesContext(connection) as ctx:
        assert worker.run() == 30
    updates = _job_updates(ctx)
    successes = [sql for sql in updates if "SUCCESSFUL" in sql or "'SUCCESSFUL'" in sql]
    marks = [sql for sql in updates if "RUNNING" in sql.split("WHERE")[0]]
    assert len(successes) == 1
    assert len(marks) == 4  # the claims' UPDATEs: 1 (idle), then 11, 11, 7
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status=SUCCESSFUL).count() == 30


def test_failures_are_written_at_once_as_without_batching(settings, clock):
    """A run that raised is written when it ends (its retry), not with the batch."""
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 60
    settings.DEBOUNCE_BACKOFF_JITTER = False
    flaky = fail_times.delay("f", 1)
    fine = work.delay("fine")
    worker = Worker(burst=True, prefetch=10, handle_signals=False, worker_id="w")
    with CaptureQueriesContext(connection) as ctx:
        worker.run()
    flaky.refresh_from_db()
    assert (flaky.status, flaky.attempts, flaky.worker_id) == (READY, 1, "")
    assert flaky.error.endswith("f failed run 1")
    assert flaky.run_at == T + dt.timedelta(seconds=5)  # DEBOUNCE_MIN_BACKOFF
    assert Job.objects.get(pk=fine.pk).status == SUCCESSFUL
    updates = _job_updates(ctx)
    retry = next(i for i, sql in enumerate(updates) if "'READY'" in sql.split("WHERE")[0])
    success = next(i for i, sql in enumerate(updates) if "'SUCCESSFUL'" in sql)
    assert retry < success  # the retry was written before the batch of successes


def test_a_dependent_runs_in_the_same_burst_once_its_dependency_is_written(settings):
    """The dependent is claimable only after the dependency's success is written: a claim that
    comes back short writes the pending successes and claims again."""
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 60
    first = work.delay("first")
    second = work.apply_async(args=("second",), depends_on=[first])
    assert Worker(burst=True, prefetch=10, handle_signals=False, worker_id="w").run() == 2
    assert Job.objects.get(pk=first.pk).status == SUCCESSFUL
    assert Job.objects.get(pk=second.pk).status == SUCCESSFUL


# -- prefetch and flow control ----------------------------------------------------------


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def test_a_prefetching_claim_takes_a_capped_job_only_for_a_free_thread(flow, clock):
    """Decision 146 (issue #17): a capped job claimed ahead held a slot while it waited."""
    capped = [flow["flow.capped"].delay(f"c{i}") for i in range(6)]
    plain = [flow["flow.plain"].delay(f"p{i}") for i in range(3)]
    worker = Worker(prefetch=20, handle_signals=False, worker_id="w", lease=LEASE)
    worker._idle = False  # a claim came back full: the next one prefetches
    worker._job_seconds = 0.001  # jobs took 1 ms so far: 200 fit the horizon, 20 the prefetch
    assert worker._claim_capacity() == 21
    claimed = worker._claim(worker._claim_capacity())
    # One free thread: it takes c0; c1 would wait for a thread, so the claim stops before it.
    assert [job.pk for job in claimed] == [capped[0].pk]
    # A claim whose jobs all start at once takes the cap's second slot, then the plain jobs.
    other = claim_jobs(worker_id="x", limit=10, lease=LEASE)
    assert [job.pk for job in other] == [capped[1].pk, *[job.pk for job in plain]]
    assert Job.objects.filter(task_name="flow.capped", status=RUNNING).count() == 2


def test_a_prefetching_claim_takes_a_token_only_for_the_job_it_starts(flow, clock):
    """rate 10/s: the claim ahead takes one token, for the free thread's job (decision 146)."""
    for i in range(15):
        flow["flow.rate"].delay(f"r{i}")
    worker = Worker(prefetch=20, handle_signals=False, worker_id="w", lease=LEASE)
    worker._idle = False
    worker._job_seconds = 0.001
    claimed = worker._claim(worker._claim_capacity())
    assert len(claimed) == 1
    assert len(claim_jobs(worker_id="x", limit=20, lease=LEASE)) == 9  # the bucket's other 9
    assert claim_jobs(worker_id="x", limit=10, lease=LEASE) == []
    clock(seconds=0.5)  # five tokens back
    assert len(claim_jobs(worker_id="x", limit=10, lease=LEASE)) == 5


def test_the_leases_of_prefetched_and_unwritten_jobs_are_renewed(clock):
    jobs = [work.delay(f"t{i}") for i in range(4)]
    worker = Worker(prefetch=10, handle_signals=False, worker_id="w", lease=LEASE)
    claimed = worker._claim(4)
    # One ran and waits for its batched write; three were claimed ahead, not started.
    worker._in_flight.update((job.pk, job) for job in claimed[1:])
    worker._successes.add(claimed[0], None, None)
    later = clock(seconds=30)
    worker._renew_leases()
    leases = dict(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "lease_expires_at")
    )
    assert leases == {job.pk: later + LEASE for job in jobs}


@pytest.mark.django_db(transaction=True)
def test_a_threaded_burst_with_prefetch_runs_every_job():
    """Regression: the loop ended the burst when a round that skipped its claim (enough jobs
    held) found every job finished by the time it looked, with 90 % of the queue left."""
    jobs = [work.delay(f"t{i}") for i in range(120)]
    worker = Worker(burst=True, concurrency=4, prefetch=20, handle_signals=False, worker_id="w")
    assert worker.run() == 120
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status=SUCCESSFUL).count() == 120


@pytest.mark.parametrize(
    ("job_seconds", "concurrency", "capacity"),
    [
        (None, 1, 1),
        (0.001, 1, 1 + 50),
        (0.01, 1, 1 + 20),
        (0.01, 4, 4 + 50),
        (0.5, 2, 2),
        (3.0, 1, 1),
    ],
    ids=["no-run-yet", "1ms-capped", "10ms", "10ms-C4", "long", "very-long"],
)
def test_a_worker_claims_ahead_what_its_threads_run_in_the_horizon(
    job_seconds, concurrency, capacity
):
    """Claimed ahead: concurrency × 0.2 s / the average run time, at most ``prefetch`` (50)."""
    worker = Worker(prefetch=50, concurrency=concurrency, handle_signals=False, worker_id="w")
    worker._idle = False
    worker._job_seconds = job_seconds
    assert worker._claim_capacity() == capacity
    worker._idle = True  # the last claim came back short: free threads only
    assert worker._claim_capacity() == concurrency
