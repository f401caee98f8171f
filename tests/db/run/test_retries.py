"""Retries: attempts, backoff windows, jitter, error text (§7, §11; field report B39)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from django_debounce import signals
from django_debounce.models import DeadLetter, Job
from tests.conftest import T
from tests.testapp.models import CallLog
from tests.testapp.tasks_worker import (
    custom_backoff,
    debounced_fail,
    fail_times,
    flaky,
    value_error,
)

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
RESERVED = ("shed:", "codel:", "unknown_task:")
FLAKY_ERROR = "tests.testapp.tasks_worker.FlakyError"


def base_delay(retry: int, min_backoff: dt.timedelta, max_backoff: dt.timedelta) -> dt.timedelta:
    """The documented base delay of retry number ``retry`` (1-based)."""
    return min(max_backoff, min_backoff * 2 ** (retry - 1))


def run_next_retry(clock, burst) -> Job | None:
    """Move the clock to the earliest READY job's ``run_at`` and run what is due then."""
    nxt = Job.objects.filter(status=Job.Status.READY).order_by("run_at", "id").first()
    if nxt is None:
        return None
    clock(at=nxt.run_at)
    burst()
    return nxt


@pytest.fixture
def finished_log():
    """Every ``job_finished``: ``(job id, attempts, status, now, run_at)`` when sent."""
    seen: list[tuple[int, int, str, dt.datetime, dt.datetime]] = []

    def receiver(sender: Any, job: Job, status: str, **kwargs: Any) -> None:
        seen.append((job.pk, job.attempts, status, timezone.now(), job.run_at))

    signals.job_finished.connect(receiver, weak=False)
    yield seen
    signals.job_finished.disconnect(receiver)


def test_fails_twice_then_succeeds_within_max_retries(clock, burst):
    job = fail_times.delay("twice", 2)
    assert job.max_retries == 3

    burst()  # run 1 at T fails
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.READY, 1)
    assert job.error == f"{FLAKY_ERROR}: twice failed run 1"
    assert "Traceback (most recent call last)" in job.traceback
    assert T + 2.5 * S <= job.run_at <= T + 5 * S  # retry 1: base 5s, jitter [base/2, base]
    assert not job.is_open_window
    first_retry_at = job.run_at

    clock(at=first_retry_at - dt.timedelta(microseconds=1))
    burst()
    assert CallLog.objects.filter(task="wrk.fail_times").count() == 1

    clock(at=first_retry_at)
    burst()  # run 2 fails
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.READY, 2)
    assert job.error == f"{FLAKY_ERROR}: twice failed run 2"
    assert first_retry_at + 5 * S <= job.run_at <= first_retry_at + 10 * S  # retry 2: base 10s

    clock(at=job.run_at)
    burst()  # run 3 succeeds
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.SUCCESSFUL, 3)
    assert job.result == "twice ok on run 3"
    assert job.finished_at == job.run_at
    runs = CallLog.objects.filter(task="wrk.fail_times").order_by("id")
    assert [row.payload["run"] for row in runs] == [1, 2, 3]
    assert DeadLetter.objects.count() == 0


def test_max_retries_zero_runs_once_then_dead_letters(clock, burst):
    job = value_error.delay()
    assert job.max_retries == 0

    burst()

    job.refresh_from_db()
    assert (job.status, job.attempts, job.finished_at) == (Job.Status.FAILED, 1, T)
    assert job.lease_expires_at is None
    assert CallLog.objects.filter(task="wrk.value_error").count() == 1
    letter = DeadLetter.objects.get()
    assert letter.job_id == job.pk
    assert letter.task_name == "wrk.value_error"
    assert letter.error == job.error == "ValueError: boom"  # a builtin: no module prefix
    assert letter.reason == "failed: 1 attempt(s); ValueError: boom"
    assert letter.traceback == job.traceback
    assert letter.traceback.startswith("Traceback (most recent call last):")
    assert 'raise ValueError("boom")' in letter.traceback
    assert letter.traceback.rstrip().endswith("ValueError: boom")
    assert letter.created_at == T

    clock(seconds=3600)
    burst()  # nothing more: a FAILED job never runs again on its own
    assert CallLog.objects.filter(task="wrk.value_error").count() == 1


def test_error_of_a_project_exception_is_dotted(clock, burst):
    job = flaky.apply_async(args=(7,), max_retries=0)
    burst()
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert job.error == letter.error == f"{FLAKY_ERROR}: downstream unavailable"
    assert 'raise FlakyError("downstream unavailable")' in letter.traceback
    assert letter.metadata == {"attempts": 1}


def test_jitter_off_gives_the_exact_formula(clock, burst, settings, finished_log):
    settings.DEBOUNCE_BACKOFF_JITTER = False
    job = flaky.apply_async(args=(1,), max_retries=8)
    burst()
    while run_next_retry(clock, burst):
        pass

    retries = [(now, run_at) for pk, _, status, now, run_at in finished_log if status == "READY"]
    delays = [(run_at - now).total_seconds() for now, run_at in retries]
    # settings: DEBOUNCE_MIN_BACKOFF=5s, DEBOUNCE_MAX_BACKOFF=5m
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300]
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.FAILED, 9)
    assert CallLog.objects.filter(task="wrk.flaky").count() == 9
    assert job.finished_at == T + dt.timedelta(seconds=sum(delays))


def test_task_backoff_options_override_settings(clock, burst, settings, finished_log):
    settings.DEBOUNCE_BACKOFF_JITTER = False
    job = custom_backoff.delay()  # max_retries=4, min_backoff="1m", max_backoff="3m"
    burst()
    while run_next_retry(clock, burst):
        pass
    delays = [(run_at - now) for _, _, status, now, run_at in finished_log if status == "READY"]
    assert delays == [dt.timedelta(minutes=m) for m in (1, 2, 3, 3)]
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.FAILED, 5)


def test_task_backoff_options_with_jitter_stay_in_their_windows(clock, burst, finished_log):
    custom_backoff.delay()
    burst()
    while run_next_retry(clock, burst):
        pass
    retries = [
        (attempt, now, run_at) for _, attempt, s, now, run_at in finished_log if s == "READY"
    ]
    assert [attempt for attempt, _, _ in retries] == [1, 2, 3, 4]
    for attempt, now, run_at in retries:
        base = base_delay(attempt, dt.timedelta(minutes=1), dt.timedelta(minutes=3))
        assert base / 2 <= run_at - now <= base


def test_a_job_waiting_for_its_retry_is_not_an_open_window(clock, burst):
    first = debounced_fail.delay("k", "v1")
    assert first.is_open_window
    clock(minutes=1)
    burst()  # runs at T+1m and fails

    first.refresh_from_db()
    assert first.status == Job.Status.READY
    assert first.attempts == 1
    assert first.window_key is None
    assert not first.is_open_window
    assert first.debounce_key == "df:k"
    assert T + dt.timedelta(minutes=1, seconds=2.5) <= first.run_at
    assert first.run_at <= T + dt.timedelta(minutes=1, seconds=5)
    retry_at = first.run_at

    clock(minutes=1, seconds=1)
    second = debounced_fail.delay("k", "v2")
    assert second.outcome == "created"
    assert second.pk != first.pk
    assert second.run_at == T + dt.timedelta(minutes=2, seconds=1)
    assert second.opened_at == T + dt.timedelta(minutes=1, seconds=1)
    assert list(Job.objects.open_windows().values_list("pk", flat=True)) == [second.pk]
    first.refresh_from_db()
    assert (first.run_at, first.enqueue_count, first.args) == (retry_at, 1, ["k", "v1"])

    clock(at=retry_at)
    burst()  # the retry runs its own payload; the new window is untouched
    versions = list(
        CallLog.objects.filter(task="wrk.debounced_fail")
        .order_by("id")
        .values_list("payload", flat=True)
    )
    assert versions == [{"version": "v1"}, {"version": "v1"}]
    second.refresh_from_db()
    assert (second.status, second.attempts, second.enqueue_count) == (Job.Status.READY, 0, 1)


@pytest.mark.slow  # ~10 s: 300 controlled-clock bursts
def test_b39_backoff_with_jitter(clock, burst, settings, finished_log):
    settings.DEBOUNCE_BACKOFF_JITTER = True
    min_backoff, max_backoff = dt.timedelta(seconds=5), dt.timedelta(minutes=5)
    assert (settings.DEBOUNCE_MIN_BACKOFF, settings.DEBOUNCE_MAX_BACKOFF) == ("5s", "5m")
    dead: list[tuple[int, int]] = []
    started: list[tuple[int, int, dt.datetime]] = []

    def on_dead(sender: Any, job: Job, dead_letter: DeadLetter, **kwargs: Any) -> None:
        dead.append((job.pk, dead_letter.pk))

    def on_started(sender: Any, job: Job, **kwargs: Any) -> None:
        started.append((job.pk, job.attempts, timezone.now()))

    signals.job_dead_lettered.connect(on_dead, weak=False)
    signals.job_started.connect(on_started, weak=False)
    try:
        jobs = [flaky.delay(n) for n in range(100)]
        assert {job.max_retries for job in jobs} == {3}
        burst()  # run@T: every first attempt fails
        assert CallLog.objects.filter(task="wrk.flaky").count() == 100
        rounds = 0
        while run_next_retry(clock, burst):
            rounds += 1
            assert rounds <= 300
    finally:
        signals.job_dead_lettered.disconnect(on_dead)
        signals.job_started.disconnect(on_started)

    # 4 runs per job, 400 executions.
    assert CallLog.objects.filter(task="wrk.flaky").count() == 400
    per_key = CallLog.objects.filter(task="wrk.flaky").values_list("key", flat=True)
    assert sorted(per_key) == sorted(str(n) for n in range(100) for _ in range(4))

    # Each retry's run_at lies in its attempt's window, and runs at that run_at.
    scheduled: dict[tuple[int, int], dt.datetime] = {}
    for pk, attempt, status, now, run_at in finished_log:
        if status != "READY":
            continue
        base = base_delay(attempt, min_backoff, max_backoff)
        assert base / 2 <= run_at - now <= base, (pk, attempt, run_at - now)
        scheduled[(pk, attempt + 1)] = run_at
    assert len(scheduled) == 300
    for pk, attempt, now in started:
        assert now == (scheduled[(pk, attempt)] if attempt > 1 else T)
    assert len(started) == 400

    # The 100 second attempts are spread: not all equal, spanning >= half their window.
    second = sorted(run_at for (pk, attempt), run_at in scheduled.items() if attempt == 2)
    assert len(second) == 100
    assert len(set(second)) > 1
    window = base_delay(1, min_backoff, max_backoff) / 2  # [2.5s, 5s] is 2.5s wide
    assert second[-1] - second[0] >= window / 2

    # End: 100 FAILED, 100 dead letters, 100 signals.
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 100
    assert Job.objects.exclude(status=Job.Status.FAILED).count() == 0
    assert set(Job.objects.values_list("attempts", flat=True)) == {4}
    letters = list(DeadLetter.objects.all())
    assert len(letters) == 100
    assert sorted(dead) == sorted((dl.job_id, dl.pk) for dl in letters)
    for letter in letters:
        assert letter.error == f"{FLAKY_ERROR}: downstream unavailable"
        assert letter.traceback.startswith("Traceback (most recent call last):")
        assert letter.traceback.rstrip().endswith(f"{FLAKY_ERROR}: downstream unavailable")
        assert letter.reason.startswith("failed: 4 attempt(s)")
        assert not any(prefix in letter.reason for prefix in RESERVED)
