"""The worker in-process: claim order, due jobs, queues, --max-jobs, --burst, results (§7, §10, §11)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import registry
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow.rules import gate_for
from django_debounce.models import Job
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.factories import JobFactory
from tests.testapp.models import CallLog
from tests.testapp.tasks_worker import RESULT_REF, async_result, record_tag, result

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
M = dt.timedelta(minutes=1)


def tags() -> list[str]:
    """Keys of the ``wrk.tag`` runs, in the order they ran."""
    return list(CallLog.objects.filter(task="wrk.tag").order_by("id").values_list("key", flat=True))


def tag_job(name: str, **fields: Any) -> Job:
    return JobFactory(task_name="wrk.tag", args=[name], **fields)


# -- claim order and due jobs ------------------------------------------------------


def test_claim_order_is_priority_then_run_at_then_id(clock, burst):
    tag_job("a", priority=0, run_at=T - M)
    tag_job("b", priority=10, run_at=T - 10 * S)
    tag_job("c", priority=10, run_at=T - 5 * M)
    tag_job("d", priority=-5, run_at=T - 10 * M)
    tag_job("e", priority=0, run_at=T - M)  # same priority and run_at as "a", larger id
    tag_job("f", priority=0, run_at=T)  # due exactly now: run_at <= now
    future = tag_job("g", priority=100, run_at=T + dt.timedelta(microseconds=1))

    burst()

    assert tags() == ["c", "b", "a", "e", "f", "d"]
    future.refresh_from_db()
    assert future.status == Job.Status.READY
    assert future.attempts == 0
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == 6


def test_claim_jobs_marks_claimed_rows_in_claim_order(clock):
    low = tag_job("low", priority=-1)
    early = tag_job("early", run_at=T - M)
    late = tag_job("late", run_at=T - S)
    high = tag_job("high", priority=1, run_at=T)
    not_due = tag_job("not-due", priority=50, run_at=T + S)

    claimed = claim_jobs(worker_id="w-1", limit=3, lease=dt.timedelta(seconds=60))

    assert [job.pk for job in claimed] == [high.pk, early.pk, late.pk]
    for job in Job.objects.filter(pk__in=[high.pk, early.pk, late.pk]):
        assert job.status == Job.Status.RUNNING
        assert job.worker_id == "w-1"
        assert job.attempts == 1
        assert job.started_at == T
        assert job.lease_expires_at == T + dt.timedelta(seconds=60)
        assert job.window_key is None
    assert Job.objects.get(pk=low.pk).status == Job.Status.READY
    assert Job.objects.get(pk=not_due.pk).status == Job.Status.READY
    assert claim_jobs(worker_id="w-2", limit=5, lease=dt.timedelta(seconds=60)) == [
        Job.objects.get(pk=low.pk)
    ]


def test_only_due_jobs_run(clock, burst):
    job = record_tag.apply_async(args=("later",), countdown=10)
    assert job.run_at == T + 10 * S

    clock(seconds=9.999999)
    burst()
    assert tags() == []
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.READY, 0)

    clock(seconds=10)
    burst()
    assert tags() == ["later"]
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    assert job.started_at == job.finished_at == T + 10 * S


# -- queues, --max-jobs, --burst ---------------------------------------------------


def test_queue_option_filters_and_is_repeatable(clock, burst):
    for name in ("a", "b", "c", "default"):
        tag_job(name, queue=name)

    burst(queues=["a", "b"])
    assert sorted(tags()) == ["a", "b"]

    burst(queues="c")  # call_command with a single queue name as a str
    assert sorted(tags()) == ["a", "b", "c"]

    burst(queues=["nothing-here"])
    assert len(tags()) == 3

    burst()  # no --queue: every queue
    assert sorted(tags()) == ["a", "b", "c", "default"]
    assert not Job.objects.filter(status=Job.Status.READY).exists()


def test_queue_flag_from_argv(clock):
    for name in ("mail", "sms", "push"):
        tag_job(name, queue=name)
    call_command("run_debounce_worker", "--burst", "--queue", "mail", "--queue", "push")
    assert sorted(tags()) == ["mail", "push"]
    assert Job.objects.get(queue="sms").status == Job.Status.READY


def test_max_jobs_stops_after_that_many_claims(clock, burst):
    for i in range(5):
        tag_job(f"j{i}", run_at=T - (10 - i) * S)

    burst(max_jobs=2)
    assert tags() == ["j0", "j1"]
    assert Job.objects.filter(status=Job.Status.READY).count() == 3

    call_command("run_debounce_worker", "--burst", "--max-jobs", "1")
    assert tags() == ["j0", "j1", "j2"]

    burst()
    assert tags() == ["j0", "j1", "j2", "j3", "j4"]


def test_burst_returns_when_nothing_is_due(clock):
    tag_job("future", run_at=T + M)
    worker = Worker(burst=True, handle_signals=False)
    assert worker.run() == 0
    assert call_command("run_debounce_worker", burst=True) is None
    assert tags() == []


def test_burst_skips_a_job_held_back_by_its_key_and_returns(clock, burst):
    """A run of the same key in flight elsewhere (live lease) holds the job back (§4.5, §11)."""
    JobFactory(
        task_name="wrk.tag",
        args=["in-flight"],
        status=Job.Status.RUNNING,
        key_hash="k" * 64,
        worker_id="elsewhere",
        attempts=1,
        started_at=T - M,
        lease_expires_at=T + M,
        run_at=T - 2 * M,
    )
    held = tag_job("held", key_hash="k" * 64, run_at=T - M)
    free = tag_job("free", run_at=T - S)

    burst()

    assert tags() == ["free"]
    held.refresh_from_db()
    assert (held.status, held.attempts) == (Job.Status.READY, 0)
    assert Job.objects.get(pk=free.pk).status == Job.Status.SUCCESSFUL


# -- results ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "stored"),
    [
        ("json", {"n": 1, "ok": True, "items": [1, "a", None], "ratio": 0.5}),
        (
            "codec",
            {
                "amount": {"__debounce__": ["decimal", "1.50"]},
                "ref": {"__debounce__": ["uuid", str(RESULT_REF)]},
                "when": {"__debounce__": ["datetime", "2026-03-01T12:30:00+00:00"]},
                "pair": [1, 2],
            },
        ),
        ("none", None),
        ("set", "{3}"),  # not encodable: stored as its repr (documented)
    ],
)
def test_result_is_stored_in_codec_json_form(clock, burst, kind, stored):
    job = result.delay(kind)
    burst()
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    assert job.result == stored
    assert job.error == ""
    assert (job.attempts, job.finished_at, job.lease_expires_at) == (1, T, None)


def test_async_task_runs_awaits_and_uses_the_async_orm(clock, burst):
    job = async_result.delay("async-1")
    burst()
    job.refresh_from_db()
    row = CallLog.objects.get(task="wrk.async_result")
    assert row.key == "async-1"
    assert job.status == Job.Status.SUCCESSFUL
    assert job.result == {
        "log_id": row.pk,
        "count": 1,
        "amount": {"__debounce__": ["decimal", "2.50"]},
    }


def test_start_and_finish_signals(clock, burst, signal_log):
    job = record_tag.delay("sig")
    assert [name for name, _, _ in signal_log] == ["job_enqueued"]
    assert signal_log[0][1]["outcome"] == "created"
    assert signal_log[0][1]["job"].pk == job.pk
    assert signal_log[0][1]["sender"] is Job

    burst()

    names = [name for name, _, _ in signal_log]
    assert names == ["job_enqueued", "job_started", "job_finished"]
    started, finished = signal_log[1][1], signal_log[2][1]
    assert set(started) == {"sender", "job"}
    assert started["job"].pk == job.pk
    assert signal_log[1][2] == Job.Status.RUNNING
    assert signal_log[2][2] == Job.Status.SUCCESSFUL
    assert set(finished) == {"sender", "job", "status"}
    assert finished["job"].pk == job.pk
    assert finished["status"] == Job.Status.SUCCESSFUL
    assert finished["job"].result == "sig"


# -- the claim costs a bounded number of queries -------------------------------------


def _claim_query_count(limit: int) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as ctx:
        claimed = claim_jobs(worker_id=f"w-{limit}", limit=limit, lease=dt.timedelta(seconds=60))
    return len(claimed), len(ctx.captured_queries)


def test_claim_query_count_is_independent_of_batch_size(clock, django_assert_max_num_queries):
    # A task with a gate (rate limit, cap, breaker) registered at import would send every
    # claim of the test process through the gate's task-state read: gated tasks belong in
    # modules registered on demand (tests/testapp/tasks_soak.py, example_project/docs/rule_tasks.py).
    gated = [
        name for name, t in registry.all_tasks().items() if gate_for(name, t.options) is not None
    ]
    assert gated == [], f"gated tasks registered at import: {gated}"
    for i in range(11):
        tag_job(f"q{i}", run_at=T - (20 - i) * S)

    one_claimed, one_queries = _claim_query_count(1)
    with django_assert_max_num_queries(4):
        ten = claim_jobs(worker_id="w-batch", limit=10, lease=dt.timedelta(seconds=60))

    Job.objects.filter(worker_id="w-batch").update(status=Job.Status.READY, worker_id="")
    ten_claimed, ten_queries = _claim_query_count(10)

    assert len(ten) == 10
    assert (one_claimed, ten_claimed) == (1, 10)
    assert one_queries == ten_queries <= 4
