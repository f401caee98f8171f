"""Dependencies (§6, §11): a job runs only after each dependency succeeded; failures cancel dependents."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connections

from django_debounce import enqueue
from django_debounce.exceptions import ConfigurationError
from django_debounce.lifecycle import shed as shed_job
from django_debounce.models import DeadLetter, Job, JobDependency
from django_debounce.run.leases import reclaim_expired_leases
from tests.conftest import T, child_env
from tests.factories import JobFactory
from tests.procs import WorkerThread, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_flow_deps import fail, gated_fail, step, window
from tests.testapp.tasks_worker import ENTERED, GATES

pytestmark = pytest.mark.django_db

Status = Job.Status


def ran(task: str = "dep.step") -> list[str]:
    """Tags of the runs of ``task``, in the order they ran."""
    return list(CallLog.objects.filter(task=task).order_by("id").values_list("key", flat=True))


def chain_after_failure() -> tuple[Job, Job, Job]:
    """A (fails for good) -> B -> C."""
    a = fail.delay("A")
    b = step.apply_async(args=("B",), depends_on=[a])
    c = step.apply_async(args=("C",), depends_on=[b.pk])
    return a, b, c


def test_failed_dependency_cancels_dependents_transitively(clock, burst, signal_log):
    a, b, c = chain_after_failure()
    assert set(b.depends_on.all()) == {a} and set(a.dependents.all()) == {b}
    burst()
    a.refresh_from_db(), b.refresh_from_db(), c.refresh_from_db()
    assert a.status == Status.FAILED
    assert (b.status, c.status) == (Status.CANCELLED, Status.CANCELLED)
    assert b.finished_at == c.finished_at == T
    assert (b.attempts, c.attempts) == (0, 0)
    assert ran() == [] and ran("dep.fail") == ["A"]
    # CANCELLED is a planned outcome: one dead letter, for A only (§8).
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == [a.pk]
    finished = [(kw["job"].pk, status) for name, kw, status in signal_log if name == "job_finished"]
    assert finished == [(a.pk, Status.FAILED)]


def test_chain_runs_in_dependency_order_in_one_burst(clock, burst):
    a = step.apply_async(args=("A",), priority=-5)
    b = step.apply_async(args=("B",), priority=50, depends_on=[a])
    c = step.apply_async(args=("C",), priority=100, depends_on=[a, b])
    d = step.apply_async(args=("D",), priority=10)
    burst()
    assert ran() == ["D", "A", "B", "C"]
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCESSFUL}
    assert {j.pk for j in (a, b, c, d)} == set(Job.objects.values_list("pk", flat=True))


def test_pending_dependency_holds_the_dependent(clock, burst):
    a = step.apply_async(args=("A",), countdown="1h")
    b = step.apply_async(args=("B",), depends_on=[a])
    burst()
    b.refresh_from_db()
    assert (b.status, b.attempts) == (Status.READY, 0)
    assert ran() == []
    clock(hours=1)
    burst()
    assert ran() == ["A", "B"]


def test_running_dependency_holds_the_dependent(clock, burst):
    a = JobFactory(status=Status.RUNNING, lease_expires_at=T + dt.timedelta(minutes=5))
    b = step.apply_async(args=("B",), depends_on=[a])
    burst()
    b.refresh_from_db()
    assert b.status == Status.READY and ran() == []


def test_depends_on_accepts_jobs_and_ids_and_drops_duplicates(clock):
    a, b = step.delay("A"), step.delay("B")
    job = enqueue("dep.step", args=("C",), depends_on=(a, b.pk, a.pk))
    assert sorted(
        JobDependency.objects.filter(job=job).values_list("dependency_id", flat=True)
    ) == [
        a.pk,
        b.pk,
    ]
    assert step.apply_async(args=("D",), depends_on=[]).depends_on.count() == 0


@pytest.mark.parametrize(
    "value, message",
    [
        (7, "must be a list of jobs or job ids, got int; wrap a single job in a list"),
        ("12", "must be a list of jobs or job ids, got str"),
        ([True], "depends_on element True is neither a Job nor a job id"),
        ([0], "depends_on element 0 is neither a Job nor a job id"),
        (["1"], "depends_on element '1' is neither a Job nor a job id"),
        ([Job(task_name="dep.step")], "depends_on holds an unsaved Job"),
    ],
)
def test_depends_on_shape_errors(clock, value, message):
    with pytest.raises(ConfigurationError, match=message):
        step.apply_async(args=("X",), depends_on=value)
    assert Job.objects.count() == 0


def test_unknown_dependency_id_is_an_error_and_writes_nothing(clock):
    a = step.delay("A")
    missing = a.pk + 1000
    with pytest.raises(ConfigurationError, match=rf"job id\(s\) \[{missing}\] that do not exist"):
        step.apply_async(args=("B",), depends_on=[a, missing])
    with pytest.raises(ConfigurationError, match="do not exist"):
        window.apply_async(args=("k",), depends_on=[missing])
    assert list(Job.objects.values_list("pk", flat=True)) == [a.pk]
    assert JobDependency.objects.count() == 0


@pytest.mark.parametrize("status", [Status.FAILED, Status.SHED, Status.CANCELLED, Status.EXPIRED])
def test_job_created_after_its_dependency_failed_is_cancelled(clock, burst, status):
    gone = JobFactory(status=status, finished_at=T)
    job = step.apply_async(args=("B",), depends_on=[gone])
    assert (job.outcome, job.status, job.finished_at) == ("created", Status.CANCELLED, T)
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and list(job.depends_on.all()) == [gone]
    burst()
    assert ran() == []


def test_job_created_after_its_dependency_succeeded_runs(clock, burst):
    done = JobFactory(status=Status.SUCCESSFUL, finished_at=T)
    job = step.apply_async(args=("B",), depends_on=[done])
    assert job.status == Status.READY
    burst()
    assert ran() == ["B"]


def test_slide_keeps_the_openers_dependencies(clock, burst):
    a, b = step.apply_async(args=("A",), countdown="1h"), step.delay("B")
    opener = window.apply_async(args=("k",), depends_on=[a])
    clock(seconds=10)
    slid = window.apply_async(args=("k", 1), depends_on=[b])
    assert slid.outcome == "debounced" and slid.pk == opener.pk
    assert list(JobDependency.objects.values_list("job_id", "dependency_id")) == [(opener.pk, a.pk)]
    clock(minutes=2)
    burst()
    assert ran("dep.window") == []  # still waiting for A, due in an hour
    clock(hours=1)
    burst()
    assert ran() == ["B", "A"] and ran("dep.window") == ["k:0"]


def test_a_new_window_stores_its_own_dependencies(clock, burst):
    a = fail.delay("A")
    opener = window.apply_async(args=("k",), depends_on=[a])
    assert opener.outcome == "created"
    burst()
    opener.refresh_from_db()
    assert opener.status == Status.CANCELLED and not opener.is_open_window
    fresh = window.apply_async(args=("k", 2))
    assert fresh.outcome == "created" and fresh.pk != opener.pk
    assert fresh.depends_on.count() == 0


def test_shed_dependency_cancels_dependents(clock):
    a = step.delay("A")
    b = step.apply_async(args=("B",), depends_on=[a])
    c = step.apply_async(args=("C",), depends_on=[b])
    letter = shed_job(a, reason="shed: test", metadata={"shed": True}, now=T)
    assert letter is not None
    assert set(Job.objects.filter(status=Status.CANCELLED).values_list("pk", flat=True)) == {
        b.pk,
        c.pk,
    }


def test_exhausted_lease_reclaim_cancels_dependents(clock):
    dead = JobFactory(
        status=Status.RUNNING,
        attempts=1,
        max_retries=0,
        worker_id="gone",
        started_at=T - dt.timedelta(minutes=5),
        lease_expires_at=T - dt.timedelta(minutes=4),
    )
    b = step.apply_async(args=("B",), depends_on=[dead])
    c = step.apply_async(args=("C",), depends_on=[b])
    assert reclaim_expired_leases() == (0, 1)
    dead.refresh_from_db(), b.refresh_from_db(), c.refresh_from_db()
    assert (dead.status, b.status, c.status) == (Status.FAILED, Status.CANCELLED, Status.CANCELLED)
    assert DeadLetter.objects.get().job == dead


def test_a_job_that_fails_for_good_on_retry_cancels_its_dependents_but_not_others(clock, burst):
    a = fail.delay("A")
    b = step.apply_async(args=("B",), depends_on=[a])
    other = step.delay("other")
    burst()
    b.refresh_from_db(), other.refresh_from_db()
    assert (b.status, other.status) == (Status.CANCELLED, Status.SUCCESSFUL)


@pytest.mark.django_db(transaction=True)
def test_chain_with_failing_head_in_a_real_worker(tmp_path):
    a, b, c = chain_after_failure()
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--burst")
        assert worker.wait(60) == 0, worker.tail()
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert statuses == {a.pk: Status.FAILED, b.pk: Status.CANCELLED, c.pk: Status.CANCELLED}
    assert ran() == [] and ran("dep.fail") == ["A"]


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_chains_across_two_worker_processes_postgres(tmp_path):
    """20 chains A→B→C drained by 2 workers × 3 threads: odd heads fail, even chains run in order."""
    chains = []
    for i in range(20):
        head = (fail if i % 2 else step).delay(f"A{i}")
        mid = step.apply_async(args=(f"B{i}",), depends_on=[head])
        chains.append((i, head, mid, step.apply_async(args=(f"C{i}",), depends_on=[mid])))
    with processes(tmp_path, child_env()) as procs:
        for n in range(2):
            procs.worker("--concurrency", "3", "--poll-interval", "0.05", name=f"worker-{n}")
        wait_for(
            lambda: not Job.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists(),
            timeout=90,
            what=lambda: f"every chain to finish\n{procs.tails()}",
        )
    order = ran()
    for i, head, mid, tail in chains:
        statuses = [Job.objects.get(pk=j.pk).status for j in (head, mid, tail)]
        if i % 2:
            assert statuses == [Status.FAILED, Status.CANCELLED, Status.CANCELLED]
            assert f"B{i}" not in order and f"C{i}" not in order
        else:
            assert statuses == [Status.SUCCESSFUL] * 3
            assert order.index(f"A{i}") < order.index(f"B{i}") < order.index(f"C{i}")
    assert DeadLetter.objects.count() == 10


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_dependents_enqueued_while_the_dependency_fails_are_never_orphaned_postgres():
    """Enqueues racing the dependency's failure: every dependent ends CANCELLED, none waits forever."""
    GATES["head"], ENTERED["head"] = threading.Event(), threading.Event()
    head = gated_fail.delay("head")
    runner = WorkerThread("race", concurrency=2).start()
    made: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                made.append(step.apply_async(args=("dep",), depends_on=[head]).pk)
        finally:
            connections.close_all()

    producer = threading.Thread(target=produce)
    try:
        assert ENTERED["head"].wait(30), "the head job never started"
        producer.start()
        wait_for(lambda: len(made) >= 20, timeout=30, what="dependents before the failure")
        GATES["head"].set()  # the head fails now, while the producer keeps enqueueing
        wait_for(
            lambda: Job.objects.filter(pk=head.pk, status=Status.FAILED).exists(),
            timeout=30,
            what="the head to fail",
        )
        count = len(made)
        wait_for(lambda: len(made) >= count + 20, timeout=30, what="dependents after the failure")
    finally:
        stop.set()
        producer.join(30)
        GATES.pop("head", None), ENTERED.pop("head", None)
        runner.stop()
    statuses = set(Job.objects.filter(pk__in=made).values_list("status", flat=True))
    assert statuses == {Status.CANCELLED}
    assert not CallLog.objects.filter(task="dep.step").exists()
