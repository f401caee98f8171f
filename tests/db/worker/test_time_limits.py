"""Time limits (issue #22 item 2, decision 187): the soft limit a task observes, the hard one.

Real jobs sleep in steps of 10 ms in a real threaded worker. The soft limit is
0.3 s (``timeout=0.3``); the hard limit of a sync task adds
``DEBOUNCE_TIMEOUT_GRACE``, 0.2 s here. A job that never checks is held by an
event the test sets at the end, so its retired thread returns late and its
result must be discarded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest

from django_debounce import debounced_task, task
from django_debounce.context import JobContext
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job
from django_debounce.run_controls import RunControl
from django_debounce.worker import Worker
from django_debounce.worker.job_threads import EXIT_STUCK
from tests.procs import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status
RELEASE = threading.Event()
RAN: list[str] = []
TIMEOUT_ERROR = "django_debounce.exceptions.JobTimeout: "


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.DEBOUNCE_TIMEOUT_GRACE = 0.2
    RELEASE.clear()
    RAN.clear()
    yield
    RELEASE.set()  # a thread still held returns (its result is discarded)


@task(name="tl.bounded", takes_context=True, timeout=0.3, max_retries=0)
def bounded(context: JobContext) -> str:
    for _ in range(500):  # 5 s
        context.checkpoint()
        time.sleep(0.01)
    return "done"


@task(name="tl.plain_steps", takes_context=True, max_retries=0)
def plain_steps(context: JobContext) -> float | None:
    left = context.time_left
    for _ in range(500):
        context.checkpoint()
        time.sleep(0.01)
    return left


@task(name="tl.async_bounded", timeout=0.3, max_retries=0)
async def async_bounded() -> str:
    await asyncio.sleep(5)
    return "woke"


@debounced_task(
    name="tl.hangs",
    debounce="1s",
    debounce_max_wait="1m",
    debounce_key="{0}",
    timeout=0.2,
    max_retries=0,
)
def hangs(key: str, hold: bool = True) -> str:
    RAN.append(f"start {key} hold={hold}")
    deadline = time.monotonic() + 10
    while hold and not RELEASE.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # no checkpoint: only the hard limit bounds it
    RAN.append(f"end {key} hold={hold}")
    return "late" if hold else "ran"


def _burst() -> float:
    began = time.monotonic()
    Worker(burst=True, concurrency=2, handle_signals=False).run()
    return time.monotonic() - began


def test_a_sync_job_past_its_timeout_fails_at_its_next_checkpoint():
    job = bounded.delay()
    took = _burst()
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert job.error == f"{TIMEOUT_ERROR}job {job.pk} ran past its timeout of 0.3s"
    assert DeadLetter.objects.get().reason.startswith("failed: 1 attempt(s); " + TIMEOUT_ERROR)
    assert 0.3 <= took < 2


def test_a_calls_timeout_is_stored_on_its_job_and_bounds_its_run():
    job = plain_steps.apply_async(timeout="300ms")
    assert Job.objects.get(pk=job.pk).timeout == timedelta(seconds=0.3)
    _burst()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error.startswith(TIMEOUT_ERROR)


def test_time_left_counts_down_from_the_timeout_and_is_none_without_one():
    control = RunControl(1, timeout=10.0)
    assert 9.5 < control.time_left() <= 10.0
    assert RunControl(1).time_left() is None
    assert not RunControl(1, timeout=10.0).timed_out()
    assert RunControl(1, timeout=1e-9).timed_out()


def test_a_timeout_is_validated_like_other_durations():
    with pytest.raises(ConfigurationError, match="timeout"):
        plain_steps.apply_async(timeout=-1)
    with pytest.raises(ConfigurationError, match="timeout"):
        task(name="tl.bad_timeout", timeout="soon")(lambda: None)
    assert not Job.objects.exists()


def test_an_async_job_is_cancelled_at_its_timeout():
    job = async_bounded.delay()
    took = _burst()
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert job.error == f"{TIMEOUT_ERROR}job {job.pk} ran past its timeout of 0.3s"
    assert took < 2


def test_past_the_hard_limit_the_job_fails_its_key_runs_on_and_the_late_result_is_discarded():
    worker = WorkerThread("tl-hard", concurrency=1, poll_interval=0.05).start()
    try:
        stuck = hangs.delay("k")
        hangs.window("k").flush()
        wait_for(lambda: RAN == ["start k hold=True"], timeout=5, what="the hanging job")
        following = hangs.delay("k", hold=False)  # the key's next window, held back meanwhile
        hangs.window("k").flush()
        wait_for(
            lambda: Job.objects.filter(pk=following.pk, status=Status.SUCCESSFUL).exists(),
            timeout=5,
            what="the key's next window to run on the fresh thread",
        )
        stuck.refresh_from_db()
        assert stuck.status == Status.FAILED
        assert stuck.error == (
            f"{TIMEOUT_ERROR}job {stuck.pk} ran past its timeout of 0.2s and its grace "
            "(DEBOUNCE_TIMEOUT_GRACE) without reaching a checkpoint; its thread was retired"
        )
        assert stuck.lease_expires_at is None and stuck.worker_id
        RELEASE.set()
        wait_for(lambda: "end k hold=True" in RAN, timeout=5, what="the stuck thread to return")
        time.sleep(0.2)  # its success write (batched or not) has had its chance
        stuck.refresh_from_db()
        assert (stuck.status, stuck.result) == (Status.FAILED, None)
        assert worker.worker.exit_code == 0 and worker.alive()
    finally:
        worker.stop()


def test_more_stuck_threads_than_allowed_stop_the_worker_with_status_75(settings):
    settings.DEBOUNCE_MAX_STUCK_THREADS = 0
    job = hangs.delay("x")
    hangs.window("x").flush()
    worker = Worker(concurrency=1, poll_interval=0.05, handle_signals=False)
    began = time.monotonic()
    worker.run()  # returns by itself: it stopped
    assert worker.exit_code == EXIT_STUCK == 75
    assert time.monotonic() - began < 3
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error.startswith(TIMEOUT_ERROR)


@task(name="tl.hangs_with_a_retry", timeout=0.2, max_retries=1)
def hangs_with_a_retry() -> str:
    RAN.append("start")
    while not RELEASE.is_set():
        time.sleep(0.01)
    return "late"


def test_a_hard_timeout_with_retries_left_is_retried_after_its_backoff():
    job = hangs_with_a_retry.delay()
    worker = WorkerThread("tl-retry", concurrency=1, poll_interval=0.05).start()
    try:
        wait_for(
            lambda: Job.objects.filter(pk=job.pk, status=Status.READY, attempts=1).exists(),
            timeout=5,
            what="the hard timeout to schedule the retry",
        )
    finally:
        RELEASE.set()
        worker.stop()
    job.refresh_from_db()
    assert (job.attempts, job.worker_id, job.lease_expires_at) == (1, "", None)
    assert job.error.startswith(TIMEOUT_ERROR) and job.run_at > job.started_at
    assert not DeadLetter.objects.exists()
