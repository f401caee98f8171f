"""The Celery executor against a real ``celery worker`` and a real broker (issue #10).

Each test runs twice: on the local Redis and on the local RabbitMQ. The
scheduler is either ``run_debounce_worker --dispatch-only`` (a subprocess) or
:func:`~django_debounce.contrib.celery.executor.dispatch_due` called here; the jobs run
in ``celery -A tests.celery_app worker --pool=solo`` subprocesses.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Iterator

import pytest
from django.db import transaction

from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.contrib.celery import handoff
from django_debounce.models import Job
from tests.processes.celery_rig import BROKERS, CeleryRig
from tests.procs import Processes, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery import record, slow_first, stacked

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

Status = Job.Status


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with processes(tmp_path, {}) as group:
        yield group


@pytest.fixture
def rig(broker: str, procs: Processes, settings) -> Iterator[CeleryRig]:
    built = CeleryRig(broker, procs, DEBOUNCE_TEST_LEASE="3s")
    for name, value in built.settings().items():
        setattr(settings, name, value)
    yield built
    procs.kill_all()
    built.close()


def _status(job_id: int) -> str:
    return str(Job.objects.get(pk=job_id).status)


def _all_done(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=Status.SUCCESSFUL).count() == len(ids)


def test_dispatcher_hands_jobs_to_a_celery_worker_that_runs_them(rig: CeleryRig) -> None:
    plain = [record.delay(f"plain-{i}") for i in range(3)]
    burst = [stacked.delay(key="k", n=n) for n in range(5)]
    assert len({job.pk for job in burst}) == 1, "a burst on one key is one job"
    assert [job.outcome for job in burst] == ["created"] + ["debounced"] * 4
    worker = rig.worker()
    rig.dispatcher("--poll-interval", "0.2")
    ids = [job.pk for job in plain] + [burst[0].pk]
    wait_for(lambda: _all_done(ids), timeout=60, what=lambda: rig.procs.tails())

    for job in plain:
        job.refresh_from_db()
        assert job.result == {"tag": job.args[0], "pid": worker.pid}
        assert job.worker_id.startswith("celery:") and job.attempts == 1
    runs = CallLog.objects.filter(task="cel.record").order_by("key")
    assert [(run.key, run.pid) for run in runs] == [(f"plain-{i}", worker.pid) for i in range(3)]
    # The stacked Celery task ran once, in the Celery worker, with the first call's payload.
    assert list(
        CallLog.objects.filter(task="cel.stacked").values_list("key", "payload", "pid")
    ) == [("k", {"n": 0}, worker.pid)]
    assert Job.objects.get(pk=burst[0].pk).result == "k:0"
    # Each message's Celery task id is its job id (Flower and AsyncResult line up).
    received = set(re.findall(r"django_debounce\.run_job\[(\d+)\] received", worker.stderr()))
    assert received == {str(pk) for pk in ids}


def test_a_plain_celery_worker_runs_jobs_of_the_default_queue(
    broker: str, procs: Processes, settings
) -> None:
    """Issue #17 item 11: no -Q, no DEBOUNCE_CELERY_QUEUES; the app's default queue is used."""
    rig = CeleryRig(broker, procs)
    rig.as_default_queue()
    settings.DEBOUNCE_CELERY_QUEUES = {}
    try:
        job = record.delay("out-of-the-box")
        rig.worker(queues=False)
        assert celery_executor.dispatch_due(app=rig.app) == 1
        wait_for(lambda: _status(job.pk) == Status.SUCCESSFUL, timeout=30, what=rig.procs.tails)
    finally:
        procs.kill_all()
        rig.close()


def test_the_dispatcher_reports_a_queue_nobody_consumes_within_seconds(rig: CeleryRig) -> None:
    """Issue #17 item 11: the line comes ~10 s after the hand-off, not after the 5-minute lease."""
    job = record.delay("nobody")
    dispatcher = rig.dispatcher("--poll-interval", "0.5")  # no Celery worker on rig.queue
    started = time.monotonic()
    line = f"never taken: no Celery worker consumed Celery queue '{rig.queue}' (jobs {job.pk} "
    wait_for(lambda: line in dispatcher.stderr(), timeout=30, what=dispatcher.tail)
    assert time.monotonic() - started < 25
    assert _status(job.pk) == Status.RUNNING, "still handed off, under its lease"


def test_a_bound_stacked_task_sees_the_job_id_and_worker_hostname(rig: CeleryRig) -> None:
    """Issue #17 item 11: ``self.request`` of a ``bind=True`` task is the message's."""
    from tests.testapp.tasks_celery import bound_request

    job = bound_request.delay("r")
    rig.worker()

    def done() -> bool:
        celery_executor.dispatch_due(app=rig.app)
        return _status(job.pk) == Status.SUCCESSFUL

    wait_for(done, timeout=60, interval=0.2, what=rig.procs.tails)
    assert Job.objects.get(pk=job.pk).result == {
        "id": str(job.pk),
        "hostname": f"celery-1-{rig.queue}@{socket.gethostname()}",
        "key": "r",
    }


def test_a_message_published_twice_runs_the_job_once(rig: CeleryRig) -> None:
    job = record.delay("twice")
    claimed = handoff.claim_for_handoff(
        scheduler_id="test", limit=10, lease=celery_executor.settings.celery_handoff_lease
    )
    assert [j.pk for j in claimed] == [job.pk]
    assert celery_executor.publish(claimed, app=rig.app) == (1, 0)
    assert celery_executor.publish(claimed, app=rig.app) == (1, 0)
    worker = rig.worker()
    wait_for(lambda: _status(job.pk) == Status.SUCCESSFUL, timeout=60, what=worker.tail)
    # The duplicate writes no Celery state (Ignore), so it cannot hide the run's (decision 152).
    wait_for(
        lambda: f"django_debounce.run_job[{job.pk}] ignored" in worker.stderr(),
        timeout=30,
        what=worker.tail,
    )
    assert worker.stderr().count(f"django_debounce.run_job[{job.pk}] succeeded") == 1
    assert CallLog.objects.filter(task="cel.record", key="twice").count() == 1
    # The duplicate may arrive while the run's success waits for its batched write (decision
    # 215): the row is then still RUNNING for the run, and the no-op says so.
    noop = rf"message for job {job.pk} is a no-op: it is (SUCCESSFUL|already running on celery:)"
    assert re.search(noop, worker.stderr()), worker.tail()
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_a_producer_rollback_dispatches_nothing(rig: CeleryRig) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        record.delay("rolled-back")
        raise RuntimeError("the view failed")
    assert celery_executor.dispatch_due(app=rig.app) == 0
    assert rig.waiting() == 0
    assert not Job.objects.exists()
    kept = record.delay("committed")
    assert celery_executor.dispatch_due(app=rig.app) == 1
    wait_for(lambda: rig.waiting() == 1, timeout=10, what="the committed job's message")
    worker = rig.worker()
    wait_for(lambda: _status(kept.pk) == Status.SUCCESSFUL, timeout=60, what=worker.tail)
    assert list(CallLog.objects.values_list("key", flat=True)) == ["committed"]


def test_a_celery_worker_killed_mid_job_leaves_a_job_that_runs_again_after_its_lease(
    rig: CeleryRig, settings
) -> None:
    job = slow_first.delay("killed")
    first = rig.worker()
    assert celery_executor.dispatch_due(app=rig.app) == 1
    wait_for(lambda: CallLog.objects.filter(key="killed").exists(), timeout=60, what=first.tail)
    running = Job.objects.get(pk=job.pk)
    assert running.status == Status.RUNNING and running.worker_id.startswith("celery:")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    second = rig.worker()

    def rerun_done() -> bool:
        celery_executor.dispatch_due(app=rig.app)  # reclaims the lapsed lease, hands it off
        return _status(job.pk) == Status.SUCCESSFUL

    started = time.monotonic()
    wait_for(rerun_done, timeout=60, interval=0.2, what=second.tail)
    assert time.monotonic() - started < 30
    done = Job.objects.get(pk=job.pk)
    assert (done.attempts, done.result) == (2, "done on attempt 2")
    runs = list(CallLog.objects.filter(key="killed").order_by("id").values_list("pid", "payload"))
    assert runs == [(first.pid, {"attempt": 1}), (second.pid, {"attempt": 2})]


def test_a_job_longer_than_its_lease_is_renewed_by_the_process_keeper_and_runs_once(
    rig: CeleryRig,
) -> None:
    """Decisions 183-184: one keeper per worker process renews it; the jobs share a connection."""
    long = record.delay("long", seconds=4.5)  # the lease is 3 s: renewed every second
    short = [record.delay(f"short-{n}") for n in range(3)]
    worker = rig.worker()

    def all_done() -> bool:
        celery_executor.dispatch_due(app=rig.app)  # would reclaim a lease that lapsed
        return _all_done([long.pk, *(job.pk for job in short)])

    wait_for(all_done, timeout=60, interval=0.2, what=worker.tail)
    assert Job.objects.get(pk=long.pk).attempts == 1, "never reclaimed: its lease was renewed"
    assert CallLog.objects.filter(key="long").count() == 1
    kept = "keeps its own connection to database 'default' across jobs in this worker process"
    # Once per process (Celery's handler prints the line; Django's console handler again).
    lines = [line for line in worker.stderr().splitlines() if kept in line and "INFO/" in line]
    assert len(lines) == 1, worker.tail()


def test_a_stopped_celery_worker_leaves_jobs_waiting_not_lost(rig: CeleryRig, settings) -> None:
    settings.DEBOUNCE_CELERY_HANDOFF_LEASE = "2s"
    worker = rig.worker()
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0
    jobs = [record.delay(f"wait-{i}") for i in range(3)]
    assert celery_executor.dispatch_due(app=rig.app) == 3
    wait_for(lambda: rig.waiting() == 3, timeout=10, what="three messages in the broker")
    # The broker loses them (a Redis restart without persistence, a purged queue).
    assert rig.purge() == 3
    time.sleep(1)
    assert {_status(job.pk) for job in jobs} == {Status.RUNNING}, "handed off, waiting"
    # Once the hand-off lease lapses, a round hands them off again, their attempt not spent.
    again = rig.worker()

    def all_ran() -> bool:
        celery_executor.dispatch_due(app=rig.app)
        return _all_done([j.pk for j in jobs])

    wait_for(all_ran, timeout=60, interval=0.2, what=again.tail)
    assert sorted(CallLog.objects.values_list("key", flat=True)) == [f"wait-{i}" for i in range(3)]
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


def test_async_result_shows_each_jobs_final_attempt_after_retries(
    procs: Processes, settings
) -> None:
    """Decisions 138, 152: a retried attempt ends in RETRY, so the final attempt's state stays."""
    from celery.result import AsyncResult

    from django_debounce.exceptions import JobFailedError, JobRetryError
    from tests.celery_app import REDIS, make_app, with_results
    from tests.testapp.tasks_celery import always_fails, flaky

    rig = CeleryRig("redis", procs, DEBOUNCE_TEST_LEASE="3s")
    prefix = f"{rig.queue}:"
    rig.env["DEBOUNCE_TEST_RESULT_PREFIX"] = prefix
    for name, value in rig.settings().items():
        setattr(settings, name, value)
    results = with_results(make_app(REDIS), prefix)
    good, once, bad = record.delay("ok"), flaky.delay("f"), always_fails.delay("nope")
    state = {job.pk: AsyncResult(str(job.pk), app=results) for job in (good, once, bad)}
    try:
        rig.worker()
        assert celery_executor.dispatch_due(app=rig.app) == 3
        wait_for(lambda: state[once.pk].state == "RETRY", timeout=60, what=rig.procs.tails)
        assert isinstance(state[once.pk].result, JobRetryError)
        assert str(state[once.pk].result).endswith("RuntimeError: first try of f")

        def finished() -> bool:
            celery_executor.dispatch_due(app=rig.app)
            return {_status(job.pk) for job in (good, once, bad)} == {"SUCCESSFUL", "FAILED"}

        wait_for(finished, timeout=60, interval=0.2, what=rig.procs.tails)
        wait_for(lambda: state[bad.pk].state == "FAILURE", timeout=10, what=rig.procs.tails)
        assert (state[good.pk].state, state[good.pk].result["tag"]) == ("SUCCESS", "ok")
        assert (state[once.pk].state, state[once.pk].result) == (
            "SUCCESS",
            {"tag": "f", "attempt": 2},
        )
        assert isinstance(state[bad.pk].result, JobFailedError)
        assert str(state[bad.pk].result).startswith(
            f"job {bad.pk} (cel.always_fails) failed for good on attempt 2: "
            "RuntimeError: no luck for nope"
        )
    finally:
        procs.kill_all()
        rig.close()
        for result in state.values():
            result.forget()
