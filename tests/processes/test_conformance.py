"""The debounce scenarios, run in every executor mode with real processes (issue #10).

One suite, one set of assertions; a mode is one entry of :data:`MODES`: a
function that starts the processes running jobs in that mode and returns
them. ``worker``: ``run_debounce_worker``; ``celery``: ``run_debounce_worker
--dispatch-only`` handing jobs to a real ``celery worker`` on the local
Redis. The processes of a mode start once per module and serve every test
(each test's rows are flushed between tests). Durations are real and short
(windows of 1 s): the processes cannot share the test's frozen clock.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal

import pytest

from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.processes.celery_rig import CeleryRig
from tests.procs import Processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_conformance import broken, ceiling, collapse, flaky, latest, slow, types

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

Status = Job.Status


@dataclass
class Mode:
    """The running processes of one executor mode."""

    name: str
    procs: Processes

    def tails(self) -> str:
        return self.procs.tails()


def _worker_mode(procs: Processes) -> None:
    env = child_env(DJANGO_SETTINGS_MODULE="tests.settings_celery", DEBOUNCE_TEST_EXECUTOR="worker")
    procs.worker("--poll-interval", "0.1", "--concurrency", "2", env=env)


def _celery_mode(procs: Processes) -> None:
    rig = CeleryRig("redis", procs, DEBOUNCE_TEST_EXECUTOR="celery")
    rig.worker()
    rig.dispatcher("--poll-interval", "0.1")


#: Mode name -> a function starting that mode's processes in the given group. Adding a mode
#: (say Django's tasks backend) is one entry here.
MODES: dict[str, Callable[[Processes], None]] = {"worker": _worker_mode, "celery": _celery_mode}


@pytest.fixture(scope="module", params=sorted(MODES))
def mode(request, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Mode]:
    workdir = tmp_path_factory.mktemp(f"mode-{request.param}")
    with Processes(workdir, {}) as procs, django_db_blocker.unblock():
        MODES[request.param](procs)
        yield Mode(request.param, procs)


def _wait_status(mode: Mode, job_id: int, *statuses: str, timeout: float = 30) -> Job:
    def reached() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.status in statuses else None

    found: Job = wait_for(reached, timeout=timeout, what=lambda: f"job {job_id}\n{mode.tails()}")
    # The run happened in this mode's executor: a Celery worker's runs carry its id.
    assert found.worker_id.startswith("celery:") == (mode.name == "celery"), found.worker_id
    return found


def test_a_burst_collapses_to_one_run_with_the_first_payload(mode: Mode) -> None:
    jobs = [collapse.delay(key="b", seq=seq) for seq in range(5)]
    assert {job.pk for job in jobs} == {jobs[0].pk}
    done = _wait_status(mode, jobs[0].pk, Status.SUCCESSFUL)
    assert done.enqueue_count == 5
    time.sleep(1.5)  # a second run, if any, would have come by now
    assert list(CallLog.objects.values_list("task", "payload")) == [
        ("conf.collapse", {"attempt": 1, "seq": 0})
    ]


def test_replace_payload_runs_once_with_the_newest_call(mode: Mode) -> None:
    jobs = [latest.delay(key="r", seq=seq) for seq in range(4)]
    _wait_status(mode, jobs[-1].pk, Status.SUCCESSFUL)
    assert list(CallLog.objects.values_list("payload", flat=True)) == [{"attempt": 1, "seq": 3}]


def test_the_max_wait_forces_a_run_while_calls_keep_coming(mode: Mode) -> None:
    first = ceiling.delay(key="m", seq=0)
    last_call = None
    for seq in range(1, 14):  # a call every 300 ms for ~4 s: the 1 s window never goes quiet
        time.sleep(0.3)
        last_call = ceiling.delay(key="m", seq=seq)
    assert last_call is not None and last_call.pk != first.pk, "the ceiling closed the window"
    done = _wait_status(mode, first.pk, Status.SUCCESSFUL)
    assert done.run_at == done.max_run_at == done.opened_at + dt.timedelta(seconds=2)
    assert done.run_reason == "max_wait"
    first_run = CallLog.objects.get(job_id=first.pk)
    assert first_run.started_at < last_call.last_enqueued_at, "it ran while calls kept coming"
    assert first_run.payload == {"attempt": 1, "seq": 0}


def test_a_call_during_a_run_opens_a_new_window_that_waits_for_it(mode: Mode) -> None:
    running = slow.delay(key="s", seconds=1.5)
    wait_for(
        lambda: CallLog.objects.filter(job_id=running.pk).exists(),
        timeout=30,
        what=lambda: f"the first run to start\n{mode.tails()}",
    )
    later = slow.delay(key="s", seconds=0)
    assert later.pk != running.pk and later.outcome == "created"
    assert Job.objects.get(pk=running.pk).status == Status.RUNNING
    _wait_status(mode, later.pk, Status.SUCCESSFUL)
    first_run = CallLog.objects.get(job_id=running.pk)
    second_run = CallLog.objects.get(job_id=later.pk)
    assert first_run.finished_at is not None
    assert second_run.started_at >= first_run.finished_at, "runs of one key never overlap"


def test_arguments_arrive_as_the_caller_passed_them(mode: Mode) -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    job = types.delay(ident, Decimal("10.50"), when, (1, 2))
    _wait_status(mode, job.pk, Status.SUCCESSFUL)
    run = CallLog.objects.get(job_id=job.pk)
    assert run.payload["types"] == ["UUID", "Decimal", "datetime", "list"]
    assert run.payload["values"] == [str(ident), "10.50", when.isoformat(), [1, 2]]


def test_a_failing_run_retries_with_backoff_then_succeeds(mode: Mode) -> None:
    job = flaky.delay(key="f", fail_times=2)
    done = _wait_status(mode, job.pk, Status.SUCCESSFUL)
    assert (done.attempts, done.result) == (3, 3)
    runs = list(CallLog.objects.order_by("id"))
    assert [run.payload["attempt"] for run in runs] == [1, 2, 3]
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert later.started_at - earlier.started_at >= dt.timedelta(milliseconds=100)
    assert not DeadLetter.objects.exists()


def test_a_job_out_of_retries_is_dead_lettered_and_its_retry_runs_again(mode: Mode) -> None:
    job = broken.delay(key="d")
    failed = _wait_status(mode, job.pk, Status.FAILED)
    assert failed.attempts == 2
    letter = DeadLetter.objects.get(job=job.pk)
    assert letter.error == "ValueError: broken d"
    assert "raise ValueError" in letter.traceback
    assert CallLog.objects.filter(job_id=job.pk).count() == 2
    retried = letter.retry()
    assert retried is not None and retried.pk != job.pk
    _wait_status(mode, retried.pk, Status.FAILED)
    assert CallLog.objects.filter(job_id=retried.pk).count() == 2
