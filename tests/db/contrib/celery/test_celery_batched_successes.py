"""Successes of the Celery task written in batches, and the promises that hold meanwhile (decision 215).

The task body runs in this process (a Celery task object called directly runs its
function), outside any transaction, so its success waits in the process's batch
(:data:`~django_debounce.contrib.celery.batched_successes.process_successes`) as in a
Celery worker; ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 30`` keeps the writer thread from
writing before the test does (``flush_all``). The real ``celery worker`` runs
(SIGKILL, warm shutdown) are tests/processes/contrib/celery/test_celery_batched_successes.py.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.utils import timezone

from django_debounce.contrib.celery import handoff
from django_debounce.contrib.celery.batched_successes import process_successes
from django_debounce.contrib.celery.routing import RUN_TASK
from django_debounce.contrib.celery.tasks import run_handoff_message
from django_debounce.models import Job
from django_debounce.run import leases
from django_debounce.run.lease_keeper import process_keeper
from django_debounce.run.success_batches import PendingSuccess, write_successes
from tests.celery_app import REDIS, make_app, with_results
from tests.conftest import require_service
from tests.processes.celery_rig import broker_up
from tests.procs import wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery import record, stacked

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status
HANDOFF = dt.timedelta(minutes=5)


@pytest.fixture(autouse=True)
def _long_interval(settings) -> None:
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = 30


def _hand_off() -> list[int]:
    return [job.pk for job in handoff.claim_for_handoff(scheduler_id="s", limit=10, lease=HANDOFF)]


def test_a_success_waits_running_under_its_lease_and_its_celery_result_is_the_stored_one() -> None:
    job = record.delay("waits")
    assert _hand_off() == [job.pk]
    result = run_handoff_message(job.pk)
    assert result["tag"] == "waits"
    row = Job.objects.get(pk=job.pk)
    assert row.status == Status.RUNNING and row.worker_id.startswith("celery:")
    assert row.lease_expires_at > timezone.now(), "still held: its key and cap wait for it"
    assert process_successes.pending_ids() == [job.pk]
    process_successes.flush_all()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.result) == (Status.SUCCESSFUL, 1, result)
    assert row.lease_expires_at is None and row.finished_at is not None
    assert process_successes.pending_ids() == []


def test_successes_of_jobs_in_a_row_are_written_together_by_the_writer_thread(settings) -> None:
    jobs = [record.delay(f"row-{n}") for n in range(5)]
    assert sorted(_hand_off()) == sorted(job.pk for job in jobs)
    threads = threading.active_count()
    for job in jobs:
        run_handoff_message(job.pk)
    assert sorted(process_successes.pending_ids()) == sorted(job.pk for job in jobs)
    assert Job.objects.filter(status=Status.RUNNING).count() == 5
    assert threading.active_count() <= threads + 1, "one writer thread, none per job"
    process_successes.stop()  # writes them, as a warm shutdown does
    done = Job.objects.filter(pk__in=[job.pk for job in jobs], status=Status.SUCCESSFUL)
    assert sorted(done.values_list("result__tag", flat=True)) == [f"row-{n}" for n in range(5)]


def test_the_next_job_of_a_key_is_not_handed_off_while_the_last_runs_success_waits(clock) -> None:
    first = stacked.delay(key="nk")
    clock(seconds=1)  # past the 300 ms window
    assert _hand_off() == [first.pk]
    assert run_handoff_message(first.pk) == "nk:0"
    second = stacked.delay(key="nk", n=1)
    assert second.pk != first.pk, "the first window closed at its claim"
    clock(seconds=2)
    assert _hand_off() == [], "runs of one key never overlap: the first is RUNNING until written"
    process_successes.flush_all()
    assert Job.objects.get(pk=first.pk).status == Status.SUCCESSFUL
    assert _hand_off() == [second.pk]


def test_a_stale_runs_waiting_success_never_overwrites_the_job_another_run_took(clock) -> None:
    job = record.delay("stale")
    assert _hand_off() == [job.pk]
    run_handoff_message(job.pk)  # run 1 returned; its success waits
    clock(seconds=61)  # the lease (60 s) lapses before the write: the worker looked dead
    assert leases.reclaim_expired_leases() == (1, 0)
    assert _hand_off() == [job.pk]
    taken = handoff.take(job.pk, worker_id="celery:other:1:run2", lease=HANDOFF)
    assert taken.job is not None and taken.job.attempts == 2
    process_successes.flush_all()  # run 1's write, fenced on its own worker id and attempt
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker_id, row.attempts) == (
        Status.RUNNING,
        "celery:other:1:run2",
        2,
    )
    assert process_successes.pending_ids() == [], "discarded as a late run, not kept"


def test_a_second_run_of_a_job_whose_first_success_still_waits_is_written_at_once(clock) -> None:
    job = record.delay("twice")
    assert _hand_off() == [job.pk]
    run_handoff_message(job.pk)
    clock(seconds=61)
    leases.reclaim_expired_leases()
    assert _hand_off() == [job.pk]
    assert run_handoff_message(job.pk)["tag"] == "twice"
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (Status.SUCCESSFUL, 2), "run 2 written at once"
    process_successes.flush_all()
    assert Job.objects.get(pk=job.pk).attempts == 2, "run 1's late success changed nothing"
    assert CallLog.objects.filter(task="cel.record", key="twice").count() == 2


@pytest.mark.parametrize("stale_first", [True, False])
def test_a_batch_of_runs_with_their_own_worker_ids_writes_only_the_current_ones(
    stale_first: bool,
) -> None:
    jobs = [record.delay(f"mixed-{n}") for n in range(3)]
    _hand_off()
    runs = []
    for n, job in enumerate(jobs):
        taken = handoff.take(job.pk, worker_id=f"celery:h:1:run{n}", lease=HANDOFF)
        assert taken.job is not None
        runs.append(taken.job)
    # Job 1 was re-taken by another run meanwhile: its row names that run's worker id.
    Job.objects.filter(pk=jobs[1].pk).update(worker_id="celery:h:2:later")
    now = timezone.now()
    entries = [
        PendingSuccess(
            job=run, stored={"n": n}, result={"n": n}, finished_at=now, worker_id=run.worker_id
        )
        for n, run in enumerate(runs)
    ]
    if not stale_first:
        entries.reverse()
    assert write_successes(entries, worker_id="celery:", using="default") == {
        jobs[0].pk,
        jobs[2].pk,
    }
    rows = Job.objects.in_bulk([job.pk for job in jobs])
    assert [(rows[j.pk].status, rows[j.pk].result) for j in jobs] == [
        (Status.SUCCESSFUL, {"n": 0}),
        (Status.RUNNING, None),
        (Status.SUCCESSFUL, {"n": 2}),
    ]


def test_with_a_result_backend_the_success_is_written_before_the_task_returns() -> None:
    """The backend's SUCCESS is final: it never precedes the row's (decisions 152, 215)."""
    require_service(broker_up(REDIS), f"needs the local Redis at {REDIS}")
    app = with_results(make_app(REDIS), f"dbt-cel-{uuid.uuid4().hex[:8]}")
    job = record.delay("stored")
    assert _hand_off() == [job.pk]
    assert app.tasks[RUN_TASK](job.pk)["tag"] == "stored"
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (Status.SUCCESSFUL, 1)
    assert process_successes.pending_ids() == []


def test_a_waiting_success_keeps_its_lease_renewed_by_the_process_keeper(settings) -> None:
    """Decision 216: a live worker's waiting success is never reclaimed."""
    settings.DEBOUNCE_LEASE = "3s"  # renewed every second
    job = record.delay("renewed")
    assert _hand_off() == [job.pk]
    run_handoff_message(job.pk)
    first = Job.objects.get(pk=job.pk).lease_expires_at
    assert job.pk in process_keeper.held_ids()
    wait_for(
        lambda: Job.objects.get(pk=job.pk).lease_expires_at > first,
        timeout=15,
        what="the keeper to renew the waiting success's lease",
    )
    assert Job.objects.get(pk=job.pk).status == Status.RUNNING
    process_successes.flush_all()
    assert job.pk not in process_keeper.held_ids(), "released once written"
    assert Job.objects.get(pk=job.pk).status == Status.SUCCESSFUL
