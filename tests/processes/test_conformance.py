"""The debounce scenarios, run in every mode with real processes (issue #10).

One suite, one set of assertions; a mode is one entry of :data:`MODES`: how
its processes start and how a producer enqueues. ``worker``:
``run_debounce_worker`` runs the ``@debounced_task`` functions of
tests/testapp/tasks_conformance.py; ``celery``: ``run_debounce_worker
--dispatch-only`` hands the same jobs to a real ``celery worker`` on the local
Redis; ``django_tasks``: Django's own ``@task`` twins of those functions
(tests/testapp/tasks_conformance_django.py), enqueued with Django's
``task.enqueue(...)`` on ``DebounceBackend`` and run by ``run_debounce_worker``;
``django_tasks_celery``: the same Django tasks run by the Celery executor
(issue #10 item 4: "run under run_debounce_worker or the Celery executor").
Every scenario runs in every mode. A producer is ``mode.producer(name)``,
whose ``.delay(*args, **kwargs)`` returns the job row the call joined or
created; in the two Django-tasks modes every finished job is also read back
through Django's ``get_result`` (status, attempts, return value, errors,
worker ids) and compared with the row.

Where Django's API differs, the scenario states the difference instead of
being skipped (docs/howto/django-tasks.md, "What differs from
``@debounced_task``"):

- arguments: Django's ``TaskResult`` holds JSON values only (it runs
  ``normalize_json`` on them), so a Django task takes JSON arguments and
  ``task.enqueue`` refuses a ``UUID``/``Decimal``/``datetime`` with
  ``PayloadError`` before anything is written, where ``@debounced_task``
  carries them through the codec (§5);
- Django's ``TaskResult`` does not say whether a call created a window or
  joined one (``Job.outcome``, §2): the suite reads that from the rows
  (a new job id, ``enqueue_count``), which every mode has.

The processes of a mode start once per module and serve every test (each
test's rows are flushed between tests). Durations are real and short
(windows of 1 s): the processes cannot share the test's frozen clock.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from django_debounce.contrib.django_tasks.results import TaskResultStatus, task_backends
from django_debounce.exceptions import PayloadError
from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.processes.celery_rig import CeleryRig
from tests.procs import Processes, wait_for
from tests.testapp import tasks_conformance, tasks_conformance_django
from tests.testapp.models import CallLog

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

Status = Job.Status


@dataclass
class Mode:
    """One executor mode: its running processes and how its producers enqueue."""

    name: str
    procs: Processes
    producer: Callable[[str], Any]
    """``producer(name)``: the conformance task ``name`` as this mode calls it (``.delay``)."""

    def tails(self) -> str:
        return self.procs.tails()


class DjangoProducer:
    """A Django ``@task`` called through Django's API: ``.delay`` is ``task.enqueue``."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def delay(self, *args: Any, **kwargs: Any) -> Job:
        """Enqueue with ``task.enqueue(*args, **kwargs)``; return the job row it names."""
        result = self.task.enqueue(*args, **kwargs)
        assert result.status == TaskResultStatus.READY, result.status
        return Job.objects.get(pk=int(result.id))


def _debounced_producer(name: str) -> Any:
    return getattr(tasks_conformance, name)


def _django_producer(name: str) -> DjangoProducer:
    return DjangoProducer(getattr(tasks_conformance_django, name))


def _worker_mode(procs: Processes) -> None:
    env = child_env(DJANGO_SETTINGS_MODULE="tests.settings_celery", DEBOUNCE_TEST_EXECUTOR="worker")
    procs.worker("--poll-interval", "0.1", "--concurrency", "2", env=env)


def _celery_mode(procs: Processes) -> None:
    rig = CeleryRig("redis", procs, DEBOUNCE_TEST_EXECUTOR="celery")
    rig.worker()
    rig.dispatcher("--poll-interval", "0.1")


#: Mode name -> (a function starting that mode's processes in the given group, its producer).
MODES: dict[str, tuple[Callable[[Processes], None], Callable[[str], Any]]] = {
    "worker": (_worker_mode, _debounced_producer),
    "celery": (_celery_mode, _debounced_producer),
    "django_tasks": (_worker_mode, _django_producer),
    "django_tasks_celery": (_celery_mode, _django_producer),
}


@pytest.fixture(scope="module", params=sorted(MODES))
def mode(request, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Mode]:
    workdir = tmp_path_factory.mktemp(f"mode-{request.param}")
    start, producer = MODES[request.param]
    with Processes(workdir, {}) as procs, django_db_blocker.unblock():
        start(procs)
        yield Mode(request.param, procs, producer)


def _check_task_result(job: Job) -> None:
    """Compare Django's ``get_result`` of a finished ``job`` with the row (decision 96)."""
    result = task_backends["default"].get_result(str(job.pk))
    assert result.status == TaskResultStatus(job.status)
    assert result.attempts == job.attempts
    assert result.worker_ids[-1] == job.worker_id
    assert (result.started_at, result.finished_at) == (job.started_at, job.finished_at)
    # A job keeps its last failure, also once a later attempt succeeded (decision 96).
    assert [e.exception_class.__name__ for e in result.errors] == (
        [job.error.split(":")[0]] if job.error else []
    )
    assert all(error.traceback.strip() for error in result.errors)
    if job.status == Status.SUCCESSFUL:
        assert result.return_value == job.result


def _wait_status(mode: Mode, job_id: int, *statuses: str, timeout: float = 30) -> Job:
    def reached() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.status in statuses else None

    found: Job = wait_for(reached, timeout=timeout, what=lambda: f"job {job_id}\n{mode.tails()}")
    # The run happened in this mode's executor: a Celery worker's runs carry its id.
    assert found.worker_id.startswith("celery:") == mode.name.endswith("celery"), found.worker_id
    if mode.name.startswith("django_tasks"):
        _check_task_result(found)
    return found


def test_a_burst_collapses_to_one_run_with_the_first_payload(mode: Mode) -> None:
    collapse = mode.producer("collapse")
    jobs = [collapse.delay(key="b", seq=seq) for seq in range(5)]
    assert {job.pk for job in jobs} == {jobs[0].pk}
    done = _wait_status(mode, jobs[0].pk, Status.SUCCESSFUL)
    assert done.enqueue_count == 5
    time.sleep(1.5)  # a second run, if any, would have come by now
    assert list(CallLog.objects.values_list("task", "payload")) == [
        ("conf.collapse", {"attempt": 1, "seq": 0})
    ]


def test_replace_payload_runs_once_with_the_newest_call(mode: Mode) -> None:
    latest = mode.producer("latest")
    jobs = [latest.delay(key="r", seq=seq) for seq in range(4)]
    _wait_status(mode, jobs[-1].pk, Status.SUCCESSFUL)
    assert list(CallLog.objects.values_list("payload", flat=True)) == [{"attempt": 1, "seq": 3}]


def test_the_max_wait_forces_a_run_while_calls_keep_coming(mode: Mode) -> None:
    first = mode.producer("ceiling").delay(key="m", seq=0)
    last_call = None
    for seq in range(1, 14):  # a call every 300 ms for ~4 s: the 1 s window never goes quiet
        time.sleep(0.3)
        last_call = mode.producer("ceiling").delay(key="m", seq=seq)
    assert last_call is not None and last_call.pk != first.pk, "the ceiling closed the window"
    done = _wait_status(mode, first.pk, Status.SUCCESSFUL)
    assert done.run_at == done.max_run_at == done.opened_at + dt.timedelta(seconds=2)
    assert done.run_reason == "max_wait"
    first_run = CallLog.objects.get(job_id=first.pk)
    assert first_run.started_at < last_call.last_enqueued_at, "it ran while calls kept coming"
    assert first_run.payload == {"attempt": 1, "seq": 0}


def test_a_call_during_a_run_opens_a_new_window_that_waits_for_it(mode: Mode) -> None:
    running = mode.producer("slow").delay(key="s", seconds=1.5)
    wait_for(
        lambda: CallLog.objects.filter(job_id=running.pk).exists(),
        timeout=30,
        what=lambda: f"the first run to start\n{mode.tails()}",
    )
    later = mode.producer("slow").delay(key="s", seconds=0)
    # A new window: a job of its own holding this one call (Django's TaskResult has no
    # ``outcome``, so every mode reads it from the rows).
    assert later.pk != running.pk
    assert Job.objects.get(pk=later.pk).enqueue_count == 1
    assert Job.objects.get(pk=running.pk).status == Status.RUNNING
    _wait_status(mode, later.pk, Status.SUCCESSFUL)
    first_run = CallLog.objects.get(job_id=running.pk)
    second_run = CallLog.objects.get(job_id=later.pk)
    assert first_run.finished_at is not None
    assert second_run.started_at >= first_run.finished_at, "runs of one key never overlap"


def test_arguments_arrive_as_the_caller_passed_them(mode: Mode) -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    types = mode.producer("types")
    if mode.name.startswith("django_tasks"):
        # Django's TaskResult holds JSON values only: the call is refused before any write,
        # and the same values sent as JSON arrive as JSON (module docstring).
        with pytest.raises(PayloadError, match="JSON"):
            types.delay(ident, Decimal("10.50"), when, (1, 2))
        assert not Job.objects.exists()
        job = types.delay(str(ident), "10.50", when.isoformat(), (1, 2))
        _wait_status(mode, job.pk, Status.SUCCESSFUL)
        run = CallLog.objects.get(job_id=job.pk)
        assert run.payload["types"] == ["str", "str", "str", "list"]
        assert run.payload["values"] == [str(ident), "10.50", when.isoformat(), [1, 2]]
        return
    job = types.delay(ident, Decimal("10.50"), when, (1, 2))
    _wait_status(mode, job.pk, Status.SUCCESSFUL)
    run = CallLog.objects.get(job_id=job.pk)
    assert run.payload["types"] == ["UUID", "Decimal", "datetime", "list"]
    assert run.payload["values"] == [str(ident), "10.50", when.isoformat(), [1, 2]]


def test_a_failing_run_retries_with_backoff_then_succeeds(mode: Mode) -> None:
    job = mode.producer("flaky").delay(key="f", fail_times=2)
    done = _wait_status(mode, job.pk, Status.SUCCESSFUL)
    assert (done.attempts, done.result) == (3, 3)
    runs = list(CallLog.objects.order_by("id"))
    assert [run.payload["attempt"] for run in runs] == [1, 2, 3]
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert later.started_at - earlier.started_at >= dt.timedelta(milliseconds=100)
    assert not DeadLetter.objects.exists()


def test_a_job_out_of_retries_is_dead_lettered_and_its_retry_runs_again(mode: Mode) -> None:
    job = mode.producer("broken").delay(key="d")
    failed = _wait_status(mode, job.pk, Status.FAILED)
    assert failed.attempts == 2
    letter = DeadLetter.objects.get(job=job.pk)
    assert letter.error == "ValueError: broken d"
    assert "raise ValueError" in letter.traceback
    assert CallLog.objects.filter(job_id=job.pk).count() == 2
    retried = letter.retry()
    assert retried is not None and retried.pk != job.pk and retried.task_name == job.task_name
    _wait_status(mode, retried.pk, Status.FAILED)
    assert CallLog.objects.filter(job_id=retried.pk).count() == 2
    assert letter.retry() is None  # already retried: nothing unless forced (§8)


def test_a_payload_the_codec_cannot_store_is_refused_at_the_call(mode: Mode) -> None:
    with pytest.raises(PayloadError):
        mode.producer("collapse").delay(key="p", seq={1, 2})
    assert not Job.objects.exists()
