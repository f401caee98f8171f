"""Adversarial tests of flow control (§6, §7, §8, §11): bad input, overflow, stalled claimers.

Each test here failed before the fix it names (see the report of helper F).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator

import pytest
from django.db import DEFAULT_DB_ALIAS, connections

from django_debounce import CircuitBreaker, enqueue, registry, task
from django_debounce.conf.durations import MAX_DURATION, parse_duration
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job, TaskState
from django_debounce.run.backoff import backoff_delay, backoff_window
from tests.conftest import T, child_env
from tests.factories import JobFactory
from tests.procs import processes
from tests.testapp.models import CallLog

Status = Job.Status
SECOND = dt.timedelta(seconds=1)


# -- durations that overflow (defect 1) -----------------------------------------------


@pytest.mark.parametrize(
    "value",
    [10**12, "1000000000d", "99999999999d", 1e20, "9" * 400 + "s", dt.timedelta(days=999_999_999)],
)
def test_a_duration_too_long_for_a_datetime_is_a_configuration_error(value):
    with pytest.raises(ConfigurationError, match="longer than the 100 years"):
        parse_duration(value, name="expires")


def test_a_huge_negative_duration_is_refused_as_not_positive():
    with pytest.raises(ConfigurationError, match="must be longer than zero"):
        parse_duration(-(10**20), name="countdown")


def test_the_longest_duration_is_accepted():
    assert parse_duration("36500d") == MAX_DURATION


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "1/1000000000d"},
        {"expires": 10**12},
        {"min_backoff": 1e20},
        {"circuit_breaker": "reset"},  # replaced below: CircuitBreaker(reset=10**12)
    ],
)
def test_registration_refuses_durations_that_would_overflow_later(options):
    if options == {"circuit_breaker": "reset"}:
        with pytest.raises(ConfigurationError, match="100 years"):
            CircuitBreaker(failures=1, reset=10**12)
        return
    with pytest.raises(ConfigurationError, match="100 years"):
        task(name="hf.never_registered", **options)(lambda: None)
    assert registry.lookup("hf.never_registered") is None


@pytest.mark.django_db
def test_a_per_call_countdown_too_long_is_refused_before_anything_is_written():
    with pytest.raises(ConfigurationError, match="100 years"):
        enqueue("hf.plain", args=["x"], countdown=10**12)
    assert not Job.objects.exists()


# -- backoff of a task with many retries (defect 2) ------------------------------------


def test_backoff_of_a_late_retry_is_capped_without_overflow():
    assert backoff_window(10_000, SECOND, dt.timedelta(hours=1)) == (
        dt.timedelta(minutes=30),
        dt.timedelta(hours=1),
    )
    assert backoff_delay(64, SECOND, dt.timedelta(hours=1), jitter=False) == dt.timedelta(hours=1)
    assert backoff_delay(3, SECOND, dt.timedelta(hours=1), jitter=False) == 4 * SECOND


@pytest.mark.django_db
def test_the_sixtieth_failed_run_of_a_task_with_many_retries_is_retried_within_max_backoff(
    clock, burst
):
    job = JobFactory(task_name="hf.flaky", args=["late"], attempts=59, max_retries=10_000)
    burst()
    job.refresh_from_db()
    assert job.status == Status.READY
    assert job.attempts == 60
    assert job.error == "tests.testapp.tasks_hardening_flow.FlakyError: late failed"
    # tests/settings.py: DEBOUNCE_MAX_BACKOFF = "5m"; with jitter the delay is in [2.5 min, 5 min]
    # (before the fix, 5 s * 2 ** 58 overflowed timedelta and the outcome was never written).
    assert T + dt.timedelta(seconds=150) <= job.run_at <= T + dt.timedelta(minutes=5)
    assert job.lease_expires_at is None
    assert CallLog.objects.filter(task="hf.flaky").count() == 1


# -- a claimer stalled inside its claim (SIGSTOP) holds a TaskState lock (defect 3) ------


@contextlib.contextmanager
def _stalled_claimer(sql: str) -> Iterator[None]:
    """Hold the row lock ``sql`` (``SELECT … FOR UPDATE``) takes, in an open transaction
    of another connection to the test database, until the block ends."""
    stalled = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        stalled.set_autocommit(False)
        with stalled.cursor() as cursor:
            cursor.execute(sql)
        yield
        stalled.rollback()
    finally:
        stalled.close()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_claimer_stalled_holding_a_task_state_lock_does_not_stall_other_workers(tmp_path):
    """Another claimer holds hf.gated's TaskState row lock and never commits (SIGSTOPped).

    A --burst worker must still run the ungated job and return, leaving the
    gated job READY for a later claim (§11: --burst never waits for held-back jobs).
    """
    TaskState.objects.create(task_name="hf.gated")
    gated = JobFactory(task_name="hf.gated", args=["g"], run_at=T)
    plain = JobFactory(task_name="hf.plain", args=["p"], run_at=T)
    with _stalled_claimer(
        "SELECT 1 FROM django_debounce_taskstate WHERE task_name = 'hf.gated' FOR UPDATE"
    ):
        with processes(tmp_path, child_env(DEBOUNCE_HF_GATED="1")) as procs:
            worker = procs.worker("--burst", "--poll-interval", "0.05")
            try:
                code = worker.wait(60)
            except Exception as exc:  # noqa: BLE001 - report the hang with the worker's log
                raise AssertionError(
                    f"the burst worker hung behind the lock\n{worker.tail()}"
                ) from exc
            assert code == 0, worker.tail()
    assert Job.objects.get(pk=plain.pk).status == Status.SUCCESSFUL
    assert Job.objects.get(pk=gated.pk).status == Status.READY
    assert list(CallLog.objects.values_list("task", flat=True)) == ["hf.plain"]


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_claimer_stalled_holding_a_codel_queue_lock_does_not_stall_other_workers(tmp_path):
    """The same with a CoDel queue's QueueState row: the other queue's job still runs."""
    from django_debounce.models import QueueState

    QueueState.objects.create(queue="hfq")
    held = JobFactory(task_name="hf.plain", args=["q"], queue="hfq", run_at=T)
    free = JobFactory(task_name="hf.plain", args=["d"], run_at=T)
    queues = '{"hfq": {"codel": {"target": "500ms", "interval": "5s"}}}'
    with _stalled_claimer(
        "SELECT 1 FROM django_debounce_queuestate WHERE queue = 'hfq' FOR UPDATE"
    ):
        with processes(tmp_path, child_env(DEBOUNCE_TEST_QUEUES=queues)) as procs:
            worker = procs.worker("--burst", "--poll-interval", "0.05")
            try:
                code = worker.wait(60)
            except Exception as exc:  # noqa: BLE001 - report the hang with the worker's log
                raise AssertionError(
                    f"the burst worker hung behind the lock\n{worker.tail()}"
                ) from exc
            assert code == 0, worker.tail()
    assert Job.objects.get(pk=free.pk).status == Status.SUCCESSFUL
    assert Job.objects.get(pk=held.pk).status == Status.READY
    assert list(CallLog.objects.values_list("key", flat=True)) == ["d"]


# -- a dead-letter sweep through a large backlog (defect 5) -----------------------------


AUTO = {"every": "10m", "min_age": "10m", "max_retries": 3}


@pytest.fixture
def slow_enqueues(clock):
    """Every enqueue moves the package clock 5 s on: a slow sweep, under the frozen clock."""
    from django_debounce.signals import job_enqueued

    elapsed = [0.0]

    def tick(sender, **kwargs):
        elapsed[0] += 5
        clock(seconds=elapsed[0])

    job_enqueued.connect(tick, dispatch_uid="hf.slow_enqueues")
    yield elapsed
    job_enqueued.disconnect(dispatch_uid="hf.slow_enqueues")


def _backlog(count: int) -> None:
    from tests.factories import DeadLetterFactory

    for i in range(count):
        DeadLetterFactory(
            job__task_name="hf.plain", job__args=[f"old{i}"], created_at=T - dt.timedelta(hours=1)
        )


@pytest.mark.django_db
def test_a_long_sweep_renews_the_leases_of_the_jobs_the_worker_is_running(settings, slow_enqueues):
    from django.utils import timezone

    from django_debounce.claim.claiming import claim_jobs
    from django_debounce.models import DeadLetter
    from django_debounce.run.leases import reclaim_expired_leases
    from django_debounce.worker.loop import Worker

    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = AUTO
    _backlog(30)  # 30 retries x 5 s = 150 s, over the 60 s lease
    running = JobFactory(task_name="hf.plain", args=["running"], run_at=T)
    worker = Worker(concurrency=2, lease=dt.timedelta(seconds=60), handle_signals=False)
    [claimed] = claim_jobs(worker_id=worker.worker_id, limit=1, lease=worker.lease)
    assert claimed.pk == running.pk
    worker._in_flight[claimed.pk] = claimed  # a job thread is running it meanwhile

    worker._sweep()

    assert slow_enqueues[0] == 150
    assert DeadLetter.objects.filter(retried_at__isnull=False).count() == 30
    claimed.refresh_from_db()
    assert claimed.status == Status.RUNNING
    assert claimed.lease_expires_at > timezone.now()
    # Another worker's maintenance finds nothing to reclaim: no second run of the job.
    assert reclaim_expired_leases() == (0, 0)


@pytest.mark.django_db
def test_a_stopping_worker_ends_its_sweep_after_the_entry_at_hand(settings, clock):
    from django_debounce.models import DeadLetter
    from django_debounce.worker.loop import Worker

    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = AUTO
    _backlog(5)
    worker = Worker(handle_signals=False)
    worker.stop()
    worker._sweep()
    assert DeadLetter.objects.filter(retried_at__isnull=False).count() == 1
    assert Job.objects.filter(status=Status.READY).count() == 1


# -- a misspelled setting (defect 6) ------------------------------------------------------


def test_a_misspelled_debounce_setting_is_reported_with_the_closest_name(settings):
    from django.core.checks import run_checks

    settings.DEBOUNCE_QUEUE = {"default": {"codel": {"target": "500ms", "interval": "5s"}}}
    warnings = [m for m in run_checks() if m.id == "django_debounce.W003"]
    assert [m.msg for m in warnings] == [
        "DEBOUNCE_QUEUE is not a django-debounce setting; it is ignored."
    ]
    assert warnings[0].hint.startswith("Did you mean DEBOUNCE_QUEUES?")


def test_known_settings_raise_no_w003(settings):
    from django.core.checks import run_checks

    settings.DEBOUNCE_QUEUES = {}
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = None
    assert [m for m in run_checks() if m.id == "django_debounce.W003"] == []


# -- producers racing on a stale (expired) open window (PostgreSQL, MariaDB) ------------


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task_name", ["dep.window", "hf.window_merge"])
def test_producers_racing_on_an_expired_open_window_open_exactly_one_new_window(task_name):
    """§4.4 with the expiry path: the stale window ends EXPIRED, one new window takes every call."""
    import threading

    from django.db import connections
    from django.utils import timezone

    from django_debounce.keys import window_hash

    now = timezone.now()
    stale = JobFactory(
        task_name=task_name,
        args=["k"],
        run_at=now + dt.timedelta(minutes=1),
        opened_at=now - dt.timedelta(minutes=20),
        max_run_at=now + dt.timedelta(minutes=5),
        debounce_key="k",
        window_key=window_hash(task_name, "k"),
        key_hash=window_hash(task_name, "k"),
        expires_at=now - SECOND,
    )
    producers = 6
    barrier = threading.Barrier(producers)
    results: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def produce(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            job = enqueue(
                task_name, args=["k"], kwargs={"ids": [i]} if "merge" in task_name else {}
            )
            results.append((job.pk, job.outcome))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    stale.refresh_from_db()
    assert stale.status == Status.EXPIRED
    fresh = Job.objects.exclude(pk=stale.pk)
    assert fresh.count() == 1
    window = fresh.get()
    assert window.status == Status.READY and window.window_key is not None
    assert sorted(outcome for _, outcome in results) == ["created"] + ["debounced"] * (
        producers - 1
    )
    assert {pk for pk, _ in results} == {window.pk}
    assert window.enqueue_count == producers


# -- worker processes killed under a concurrency cap and during a breaker probe (row locks) --


def _most_overlapping(intervals: list[tuple[dt.datetime, dt.datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = best = 0
    for _, delta in events:  # at equal instants an end (-1) sorts before a start (+1)
        running += delta
        best = max(best, running)
    return best


def _gated_env() -> dict[str, str]:
    return child_env(DEBOUNCE_HF_GATED="1", DEBOUNCE_TEST_LEASE="3s")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_under_a_concurrency_cap_loses_no_job_and_never_breaks_the_cap(tmp_path):
    import os
    import signal

    from django.utils import timezone

    from tests.procs import wait_for

    jobs = [
        JobFactory(task_name="hf.capped", args=[f"c{i}", 1.5], run_at=T, max_retries=3)
        for i in range(8)
    ]
    with processes(tmp_path, _gated_env()) as procs:
        workers = [
            procs.worker("--concurrency", "2", "--poll-interval", "0.05", name=f"w{i}")
            for i in range(3)
        ]
        first = wait_for(
            lambda: CallLog.objects.filter(task="hf.capped").order_by("pk").first(),
            timeout=60,
            what="a first run",
        )
        victim = next(w for w in workers if w.pid == first.pid)
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = timezone.now()
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=[j.pk for j in jobs], status=Status.SUCCESSFUL).count()
                == len(jobs)
            ),
            timeout=120,
            what=lambda: f"every job to succeed\n{procs.tails()}",
        )
    logs = list(CallLog.objects.filter(task="hf.capped"))
    unfinished = [log for log in logs if log.finished_at is None]
    assert unfinished and all(log.pid == victim.pid for log in unfinished)
    intervals = [(log.started_at, log.finished_at or killed_at) for log in logs]
    assert _most_overlapping(intervals) <= 2
    runs = {job.pk: sum(1 for log in logs if log.job_id == job.pk) for job in jobs}
    assert set(runs.values()) <= {1, 2}
    # Only the killed worker's runs ran twice: each reclaimed once its lease lapsed.
    assert {pk for pk, n in runs.items() if n == 2} == {log.job_id for log in unfinished}


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_killed_probe_holds_the_breaker_until_its_lease_lapses_then_a_new_probe_runs(tmp_path):
    import os
    import signal

    from tests.procs import wait_for

    failing = JobFactory(task_name="hf.breaker", args=["fail0", 0.0], run_at=T, max_retries=0)
    with processes(tmp_path, _gated_env()) as procs:
        first = procs.worker("--poll-interval", "0.05", name="first")
        wait_for(
            lambda: Job.objects.get(pk=failing.pk).status == Status.FAILED,
            timeout=60,
            what=lambda: f"the failing run\n{procs.tails()}",
        )
        assert TaskState.objects.get(task_name="hf.breaker").breaker_state == "open"
        probe = JobFactory(task_name="hf.breaker", args=["probe", 30.0], run_at=T, max_retries=0)
        wait_for(
            lambda: CallLog.objects.filter(job_id=probe.pk).exists(),
            timeout=60,
            what=lambda: f"the probe to start\n{procs.tails()}",
        )
        state = TaskState.objects.get(task_name="hf.breaker")
        assert (state.breaker_state, state.probe_job_id) == ("half_open", probe.pk)
        os.kill(first.pid, signal.SIGKILL)
        lease_at_kill = Job.objects.get(pk=probe.pk).lease_expires_at
        second = JobFactory(task_name="hf.breaker", args=["second", 0.0], run_at=T, max_retries=0)
        procs.worker("--poll-interval", "0.05", name="next")
        wait_for(
            lambda: Job.objects.get(pk=second.pk).status == Status.SUCCESSFUL,
            timeout=60,
            what=lambda: f"the next probe\n{procs.tails()}",
        )
        # The claim that admits the next probe may see the lapsed lease a moment before the
        # worker's lease reclaim (its own step, once per poll) turns the dead probe FAILED.
        wait_for(
            lambda: Job.objects.get(pk=probe.pk).status != Status.RUNNING,
            timeout=30,
            what=lambda: f"the dead probe's lease to be reclaimed\n{procs.tails()}",
        )
    started = CallLog.objects.get(job_id=second.pk).started_at
    assert started >= lease_at_kill  # never while the killed probe's lease was live
    probe.refresh_from_db()
    assert probe.status == Status.FAILED  # max_retries=0: a run whose worker died used it up
    assert DeadLetter.objects.filter(job_id=probe.pk).count() == 1
    state = TaskState.objects.get(task_name="hf.breaker")
    assert (state.breaker_state, state.failures, state.probe_job_id) == ("closed", 0, None)


# -- a dependency id past the 64-bit range (defect 8) -------------------------------------


@pytest.mark.django_db
def test_a_dependency_id_past_the_64_bit_range_is_reported_as_missing():
    real = enqueue("hf.plain", args=["dep"])
    with pytest.raises(ConfigurationError, match=r"depends_on names job id\(s\) \[1000000000"):
        enqueue("hf.plain", args=["x"], depends_on=[real, 10**20])
    assert list(Job.objects.values_list("pk", flat=True)) == [real.pk]


# -- retry_dead_letters --older-than in seconds, as its help says (defect 9) -----------------


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", ["600", "600.5", " 600 "])
def test_retry_dead_letters_older_than_takes_plain_seconds(clock, seconds):
    from io import StringIO

    from django.core.management import call_command

    from tests.factories import DeadLetterFactory

    DeadLetterFactory(job__task_name="hf.plain", job__args=["old"], created_at=T - 700 * SECOND)
    DeadLetterFactory(job__task_name="hf.plain", job__args=["new"], created_at=T - 60 * SECOND)
    out = StringIO()
    call_command("retry_dead_letters", "--older-than", seconds, stdout=out)
    assert out.getvalue().startswith("retried 1, ")
    assert list(Job.objects.filter(status=Status.READY).values_list("args", flat=True)) == [["old"]]


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "-5", "garbage", "99999999999d"])
def test_retry_dead_letters_bad_older_than_is_a_command_error(value):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--older-than="):
        call_command("retry_dead_letters", "--older-than", value)
