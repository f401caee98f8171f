"""The debounce scenarios in the Django-tasks mode, under a real worker on PostgreSQL (issue #10).

Producers are Django's own ``@task`` functions (tests/testapp/tasks_django.py)
on ``DebounceBackend``; a ``run_debounce_worker`` subprocess runs them. Each
scenario is one function of ``mode`` so the shared conformance suite
(tests/processes/test_conformance.py, parametrised by mode) can fold these in:
``enqueue(task, *args)`` is the mode's producer call, ``worker`` its executor.

Windows are short (1 s, ceiling 3 s) and time is real, so the bounds below
allow for the worker's 100 ms poll and a loaded machine; none asserts a speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_debounce.models import DeadLetter, Job
from django_debounce.task_results import TaskResultStatus
from tests.conftest import child_env, is_postgres, require_service
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_django import conf_fails, conf_latest, conf_slow, conf_window

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

MODE = "django_tasks"


def enqueue(task: Any, *args: Any) -> str:
    """The Django-tasks mode's producer call: ``task.enqueue``; returns the job id."""
    return str(task.enqueue(*args).id)


@pytest.fixture
def worker(tmp_path) -> Iterator[Callable[[], str]]:
    """A ``run_debounce_worker`` subprocess polling every 100 ms; yields its log tail."""
    require_service(is_postgres(), "the conformance scenarios run on PostgreSQL")
    with processes(tmp_path, child_env()) as procs:
        proc = procs.worker("--poll-interval", "0.1", "--worker-id", "conformance")
        yield procs.tails
        assert proc.alive(), proc.tail()


def runs(name: str, key: str) -> list[CallLog]:
    return list(CallLog.objects.filter(task=name, key=key).order_by("started_at"))


def test_a_burst_collapses_to_one_run(worker):
    ids = {enqueue(conf_window, "burst", revision) for revision in range(5)}
    assert len(ids) == 1
    job_id = ids.pop()
    wait_for(
        lambda: conf_window.get_result(job_id).status == TaskResultStatus.SUCCESSFUL,
        timeout=20,
        what=worker,
    )
    time.sleep(1.5)  # a second run would have come by now
    assert [r.payload for r in runs("dj.conf_window", "burst")] == [{"revision": 0}]
    assert Job.objects.get(pk=int(job_id)).enqueue_count == 5
    assert conf_window.get_result(job_id).return_value == 0


def test_max_wait_forces_a_run_while_calls_keep_coming(worker):
    started = time.monotonic()
    first = enqueue(conf_window, "ceiling", 0)
    revision = 0
    # A call every 0.3 s never lets the 1 s window go quiet; only the 3 s ceiling runs it.
    while not runs("dj.conf_window", "ceiling"):
        assert time.monotonic() - started < 20, worker()
        time.sleep(0.3)
        revision += 1
        enqueue(conf_window, "ceiling", revision)
    elapsed = time.monotonic() - started
    assert 2.5 <= elapsed <= 10, elapsed
    job = Job.objects.get(pk=int(first))
    assert job.run_reason == "max_wait"
    assert runs("dj.conf_window", "ceiling")[0].payload == {"revision": 0}


def test_a_call_during_a_run_opens_a_new_window_that_waits_for_it(worker):
    first = enqueue(conf_slow, "during", 1, 2.0)
    wait_for(
        lambda: Job.objects.filter(pk=int(first), status="RUNNING").exists(),
        timeout=20,
        what=worker,
    )
    second = enqueue(conf_slow, "during", 2, 0.0)
    assert second != first
    assert Job.objects.get(pk=int(second)).status == "READY"
    wait_for(
        lambda: conf_slow.get_result(second).status == TaskResultStatus.SUCCESSFUL,
        timeout=30,
        what=worker,
    )
    done = runs("dj.conf_slow", "during")
    assert [r.payload for r in done] == [{"revision": 1}, {"revision": 2}]
    assert done[1].started_at >= done[0].finished_at  # runs of one key never overlap (§4.5)


def test_payload_rules(worker):
    from django_debounce.exceptions import PayloadError

    latest = {enqueue(conf_latest, "payload", revision) for revision in range(3)}
    first = {enqueue(conf_window, "payload", revision) for revision in range(3)}
    with pytest.raises(PayloadError):
        conf_window.enqueue("payload", {1, 2})
    for job_id in (*latest, *first):
        wait_for(
            lambda job_id=job_id: Job.objects.get(pk=int(job_id)).status == "SUCCESSFUL",
            timeout=20,
            what=worker,
        )
    assert [r.payload for r in runs("dj.conf_latest", "payload")] == [{"revision": 2}]
    assert [r.payload for r in runs("dj.conf_window", "payload")] == [{"revision": 0}]
    assert Job.objects.count() == 2


def test_dead_letter_and_retry(worker):
    job_id = enqueue(conf_fails, "dead")
    wait_for(
        lambda: conf_fails.get_result(job_id).status == TaskResultStatus.FAILED,
        timeout=30,
        what=worker,
    )
    result = conf_fails.get_result(job_id)
    assert result.attempts == 2
    assert result.errors[0].exception_class is RuntimeError
    letter = DeadLetter.objects.get(job_id=int(job_id))
    assert letter.reason.startswith("failed:")
    retried = letter.retry()
    assert retried is not None and retried.task_name == conf_fails.module_path
    wait_for(
        lambda: conf_fails.get_result(str(retried.pk)).status == TaskResultStatus.FAILED,
        timeout=30,
        what=worker,
    )
    assert len(runs("dj.conf_fails", "dead")) == 4
    assert letter.retry() is None  # already retried: nothing unless forced (§8)
