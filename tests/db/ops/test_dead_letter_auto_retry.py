"""The automatic dead-letter retry sweep (§8, §11): DEBOUNCE_DEAD_LETTER_AUTO_RETRY."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core.checks import run_checks
from django.db import connections

from django_debounce.conf import AutoRetry, parse_auto_retry
from django_debounce.exceptions import ConfigurationError
from django_debounce.lifecycle import shed as shed_job
from django_debounce.models import DeadLetter, Job
from django_debounce.ops.sweep import auto_retry, retry_dead_letters
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory
from tests.procs import WorkerThread, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_flow_deps import fail

pytestmark = pytest.mark.django_db

Status = Job.Status
CONFIG = {"every": "10m", "min_age": "10m", "max_retries": 3}
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def auto(settings):
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = CONFIG
    return settings


def runs(task: str = "dep.fail") -> int:
    return CallLog.objects.filter(task=task).count()


def old_letter(**fields) -> DeadLetter:
    """A never-retried ``dep.step`` dead letter written an hour before T."""
    fields.setdefault("job__task_name", "dep.step")
    fields.setdefault("job__args", ["old"])
    fields.setdefault("created_at", T - dt.timedelta(hours=1))
    return DeadLetterFactory(**fields)


def test_sweep_retries_failed_entries_along_a_chain_at_most_max_retries_times(clock, burst, auto):
    fail.delay("x")
    burst()  # run at T: fails for good, dead letter 0
    first = DeadLetter.objects.get()
    assert (first.retry_depth, first.created_at, runs()) == (0, T, 1)

    clock(minutes=9, seconds=59)
    burst()  # too young: min_age is 10m
    first.refresh_from_db()
    assert first.retried_at is None and runs() == 1

    for n in (1, 2, 3):
        clock(minutes=10 * n)
        burst()  # the sweep at the start of the burst retries; the burst runs the retry, it fails
        assert runs() == n + 1
        letters = list(DeadLetter.objects.order_by("id"))
        assert [dl.retry_depth for dl in letters] == list(range(n + 1))
        parent, newest = letters[-2], letters[-1]
        assert parent.retried_at == T + 10 * n * MINUTE
        assert parent.retry_job_id == newest.job_id
        assert newest.retried_at is None and newest.created_at == T + 10 * n * MINUTE

    clock(hours=2)
    burst()  # the fourth entry is at max_retries: left for a person
    assert runs() == 4
    assert DeadLetter.objects.filter(retried_at__isnull=True).count() == 1
    result = auto_retry(parse_auto_retry(CONFIG))  # type: ignore[arg-type]
    assert (result.retried, result.exhausted, result.already_retried) == (0, 1, 3)


def test_sweep_skips_reserved_prefixes(clock, burst, auto):
    shed_target = JobFactory(task_name="dep.step", args=["shed"])
    shed = shed_job(
        shed_target, reason="shed: rate limit 1/s exceeded", metadata={"shed": True}, now=T
    )
    codel = old_letter(reason="codel: waited 61.0s, over target 5.0s", metadata={"codel": True})
    unknown = old_letter(job__task_name="gone.task", reason="unknown_task: gone.task")
    failed = old_letter()
    clock(hours=1)
    burst()
    for letter in (shed, codel, unknown):
        assert letter is not None
        letter.refresh_from_db()
        assert letter.retried_at is None and letter.retry_job is None
    failed.refresh_from_db()
    assert failed.retried_at == T + dt.timedelta(hours=1)
    assert CallLog.objects.filter(task="dep.step").values_list("key", flat=True).get() == "old"


def test_sweep_is_off_without_the_setting(clock, burst, settings):
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = None
    letter = old_letter()
    burst()
    letter.refresh_from_db()
    assert letter.retried_at is None
    assert Job.objects.count() == 1


def test_worker_sweeps_at_start_then_at_most_once_per_every(clock, auto):
    worker = Worker(handle_signals=False)
    first = old_letter()
    worker._sweep()
    first.refresh_from_db()
    assert first.retried_at == T

    second = old_letter()
    for minutes in (1, 5, 9):
        clock(minutes=minutes, seconds=59)
        worker._sweep()
        second.refresh_from_db()
        assert second.retried_at is None
    clock(minutes=10)
    worker._sweep()
    second.refresh_from_db()
    assert second.retried_at == T + 10 * MINUTE

    # A new worker (every --burst is one) sweeps at its start.
    third = old_letter()
    Worker(handle_signals=False)._sweep()
    third.refresh_from_db()
    assert third.retried_at == T + 10 * MINUTE


@pytest.mark.django_db(transaction=True)
def test_worker_loop_sweeps_again_after_every(clock, auto):
    first = old_letter()
    runner = WorkerThread("sweeper", concurrency=2).start()
    try:
        wait_for(
            lambda: DeadLetter.objects.filter(pk=first.pk, retried_at__isnull=False).exists(),
            timeout=30,
            what="the first sweep",
        )
        wait_for(lambda: CallLog.objects.exists(), timeout=30, what="the retried job to run")
        second = old_letter()
        clock(minutes=10)
        wait_for(
            lambda: DeadLetter.objects.filter(pk=second.pk, retried_at__isnull=False).exists(),
            timeout=30,
            what="the sweep after `every`",
        )
    finally:
        runner.stop()
    assert DeadLetter.objects.get(pk=second.pk).retried_at == T + 10 * MINUTE


def test_retry_depth_of_a_shed_retry(clock):
    parent = old_letter()
    job = parent.retry()
    assert job is not None
    letter = shed_job(job, reason="shed: test", metadata={"shed": True}, now=T)
    assert letter is not None and letter.retry_depth == 1


def test_retry_dead_letters_counts_and_dry_run(clock):
    letters = [old_letter() for _ in range(3)]
    young = old_letter(created_at=T)
    before = Job.objects.count()
    preview = retry_dead_letters(older_than=dt.timedelta(minutes=10), dry_run=True)
    assert (preview.retried, preview.job_ids) == (3, [])
    assert Job.objects.count() == before
    assert not DeadLetter.objects.filter(retried_at__isnull=False).exists()
    done = retry_dead_letters(older_than=dt.timedelta(minutes=10), limit=2)
    assert done.retried == 2 and len(done.job_ids) == 2
    assert [
        dl.retry_job_id
        for dl in DeadLetter.objects.filter(pk__in=[dl.pk for dl in letters]).order_by(
            "created_at", "id"
        )
    ][:2] == done.job_ids
    young.refresh_from_db()
    assert young.retried_at is None


def test_a_retry_that_raises_is_counted_and_the_rest_go_on(clock, settings):
    broken = old_letter(job__task_name="dep.window", job__args=[{"not": "a key"}])
    fine = old_letter()
    result = retry_dead_letters()
    assert (result.retried, result.failed) == (1, 1)
    broken.refresh_from_db(), fine.refresh_from_db()
    assert broken.retried_at is None and fine.retried_at == T


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_sweeps_retry_each_entry_once(clock):
    letters = [old_letter(job__args=[f"e{i}"]) for i in range(40)]
    config = AutoRetry(every=10 * MINUTE, min_age=10 * MINUTE, max_retries=3)
    results = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        try:
            barrier.wait(10)
            results.append(auto_retry(config))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2
    assert sum(r.retried for r in results) == 40
    assert Job.objects.filter(task_name="dep.step", status=Status.READY).count() == 40
    assert (
        len({dl.retry_job_id for dl in DeadLetter.objects.filter(pk__in=[d.pk for d in letters])})
        == 40
    )


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "must be None \\(off\\) or a dict"),
        ({"every": "10m", "often": 1}, "unknown key\\(s\\) \\['often'\\]"),
        (
            {"every": "soon"},
            "DEBOUNCE_DEAD_LETTER_AUTO_RETRY\\[\"every\"\\]='soon' is not a duration",
        ),
        ({"min_age": 0}, "must be longer than zero"),
        ({"max_retries": 0}, "must be an int >= 1"),
        ({"max_retries": "3"}, "must be an int >= 1"),
    ],
)
def test_bad_setting_is_e013(settings, value, message):
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = value
    with pytest.raises(ConfigurationError, match=message):
        parse_auto_retry(value)
    errors = [m for m in run_checks() if m.id == "django_debounce.E013"]
    assert len(errors) == 1


def test_setting_defaults_and_check_passes(settings):
    assert parse_auto_retry({}) == AutoRetry(every=10 * MINUTE, min_age=10 * MINUTE, max_retries=3)
    assert parse_auto_retry({"every": 60, "max_retries": 1}) == AutoRetry(
        every=MINUTE, min_age=10 * MINUTE, max_retries=1
    )
    assert parse_auto_retry(None) is None
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = CONFIG
    assert not [m for m in run_checks() if m.id == "django_debounce.E013"]


def test_b39_dead_letters_are_swept(clock, burst, auto):
    """B39's last bullet: a job that failed every retry is dead-lettered without a reserved
    prefix, so the sweep retries it once it is ``min_age`` old (§8)."""
    from tests.testapp.tasks_worker import flaky

    job = flaky.delay(1)
    for hours in range(4):  # 4 runs: the first attempt and 3 retries (backoff at most 1h)
        clock(hours=2 * hours)
        burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.FAILED, 4)
    letter = DeadLetter.objects.get()
    assert not letter.reason.startswith(("shed:", "codel:", "unknown_task:"))
    swept_at = letter.created_at + dt.timedelta(minutes=10)
    clock(at=swept_at)
    burst()
    letter.refresh_from_db()
    assert letter.retried_at == swept_at
    assert letter.retry_job is not None and letter.retry_job.task_name == "wrk.flaky"
    assert CallLog.objects.filter(task="wrk.flaky").count() == 5
