"""Throttle, on_excess, concurrency caps and circuit breakers under a controlled clock (§6, §11; B38).

Every test here drives the real claim (``claim_jobs`` or ``run_debounce_worker
--burst``) with the clock frozen at T, so token refills, breaker resets and
lease expiries happen at exact instants. Runs with real worker processes on
PostgreSQL are in ``processes/test_flow_control_across_workers.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import CircuitBreaker, registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.flow.throttle import TokenBucket, bucket_for
from django_debounce.models import DeadLetter, Job, TaskState
from django_debounce.run.leases import reclaim_expired_leases
from tests.conftest import T
from tests.testapp import tasks_flow
from tests.testapp.models import CallLog

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=60)
READY, RUNNING, SUCCESSFUL, FAILED, SHED = (
    Job.Status.READY,
    Job.Status.RUNNING,
    Job.Status.SUCCESSFUL,
    Job.Status.FAILED,
    Job.Status.SHED,
)


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    """Register the flow-control tasks for one test (they gate every claim), then forget them."""
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def ran(name: str) -> list[str]:
    """Tags of the runs of task ``name``, in start order."""
    return list(CallLog.objects.filter(task=name).order_by("id").values_list("key", flat=True))


def started(name: str) -> list[int]:
    """Numbers of the B38 calls that ran (threads start them in any order)."""
    return sorted(int(tag) for tag in ran(name))


def statuses(name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Job.objects.filter(task_name=name).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def claim(limit: int = 10, worker_id: str = "w") -> list[Job]:
    return claim_jobs(worker_id=worker_id, limit=limit, lease=LEASE)


# -- registration (§2, §6, §11) ------------------------------------------------------


def _noop() -> None: ...


@pytest.mark.parametrize("rate", ["10/s", "5/10s", "100/h", "1/d", "10/m", " 3 / m "])
def test_rates_register(rate):
    created = task(name=f"flow.reg.{rate}", rate_limit=rate)(_noop)
    try:
        assert created.options.rate_limit == rate.strip()
        assert created.options.on_excess == "defer"
    finally:
        registry.unregister(created.name)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rate_limit": "ten/m"}, r"rate_limit='ten/m' is not a rate"),
        ({"rate_limit": "0/s"}, "is not a rate"),
        (
            {"rate_limit": "10/fortnight"},
            r"rate_limit='10/fortnight' is not a rate: its period 'fort",
        ),
        ({"rate_limit": 10}, "must be a str 'N/period'"),
        ({"on_excess": "queue"}, r"on_excess='queue' is unknown"),
        ({"concurrency": 0}, r"concurrency=0 must be an int >= 1"),
        ({"concurrency": -1}, r"concurrency=-1 must be an int >= 1"),
        ({"concurrency": 1.5}, r"concurrency=1.5 must be an int >= 1"),
        ({"concurrency": "2"}, r"concurrency='2' must be an int >= 1"),
        ({"concurrency": True}, r"concurrency=True must be an int >= 1"),
        ({"rate_limit": "10/s", "rate_limit_burst": 0}, r"rate_limit_burst=0 must be an int"),
        ({"rate_limit": "10/s", "rate_limit_burst": 2.5}, "rate_limit_burst=2.5 must be an int"),
        ({"rate_limit_burst": 5}, "give rate_limit= too"),
        ({"circuit_breaker": "5/1m"}, "must be a django_debounce.CircuitBreaker"),
        ({"circuit_breaker": {"failures": 5}}, "must be a django_debounce.CircuitBreaker"),
    ],
)
def test_registration_errors(options, match):
    with pytest.raises(ConfigurationError, match=match) as info:
        task(name="flow.reg.bad", **options)(_noop)
    assert "task 'flow.reg.bad'" in str(info.value) or "rate_limit=" in str(info.value)
    assert registry.lookup("flow.reg.bad") is None


@pytest.mark.parametrize("option", ["rate_limit", "concurrency", "circuit_breaker", "on_excess"])
def test_flow_control_options_are_task_level_only(flow, option, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ConfigurationError, match="unknown enqueue"):
        flow["flow.rate"].apply_async(args=("x",), **{option: None})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"failures": 0}, r"CircuitBreaker\(failures=0\).*int >= 1"),
        ({"failures": -3}, r"failures=-3"),
        ({"failures": 2.0}, r"failures=2.0"),
        ({"failures": True}, r"failures=True"),
        ({"reset": "soon"}, r"CircuitBreaker\(reset\)='soon' is not a duration"),
        ({"reset": 0}, r"CircuitBreaker\(reset\)=0 must be longer than zero"),
        ({"reset": -5}, "must be longer than zero"),
        ({"reset": dt.timedelta(0)}, "must be longer than zero"),
        ({"reset": None}, "has type NoneType"),
    ],
)
def test_circuit_breaker_errors(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        CircuitBreaker(**kwargs)


def test_circuit_breaker_values():
    assert CircuitBreaker() == CircuitBreaker(failures=5, reset="1m")
    breaker = CircuitBreaker(failures=3, reset="1m30s")
    assert (breaker.failures, breaker.reset) == (3, dt.timedelta(seconds=90))
    assert CircuitBreaker(reset=2.5).reset == dt.timedelta(seconds=2.5)
    with pytest.raises(AttributeError):
        breaker.failures = 4  # type: ignore[misc]


# -- the bucket's arithmetic -------------------------------------------------------------


def test_token_bucket_math():
    bucket = bucket_for("10/m")
    assert bucket == TokenBucket(capacity=10, per_second=10 / 60, text="10/m")
    assert bucket.level(None, None, T) == 10.0  # never used: full
    assert bucket.level(0.0, T, T + 6 * S) == pytest.approx(1.0)
    assert TokenBucket.whole(bucket.level(0.0, T, T + 6 * S)) == 1
    assert TokenBucket.whole(bucket.level(0.0, T, T + 5.999 * S)) == 0
    assert bucket.level(0.0, T, T + 3600 * S) == 10.0  # capped at capacity
    assert bucket.level(4.0, T, T - 10 * S) == 4.0  # a clock that went back adds nothing
    assert bucket.take(None, None, T, 3) == 7.0
    assert bucket_for("5/10s") == TokenBucket(capacity=5, per_second=0.5, text="5/10s")
    assert bucket_for("10/s", 25).capacity == 25


# -- rate limit, defer (§6, §11) ----------------------------------------------------------


def test_deferred_jobs_keep_their_place_and_run_as_tokens_refill(clock, burst, flow):
    jobs = [flow["flow.rate"].delay(f"r{i:02}") for i in range(25)]

    burst()
    assert ran("flow.rate") == [f"r{i:02}" for i in range(10)]  # capacity = the N of "10/s"
    waiting = Job.objects.filter(task_name="flow.rate", status=READY).order_by("id")
    assert [job.pk for job in waiting] == [job.pk for job in jobs[10:]]
    assert all(job.run_at == T and job.attempts == 0 for job in waiting)
    state = TaskState.objects.get(task_name="flow.rate")
    assert (state.tokens, state.tokens_at) == (0.0, T)

    clock(seconds=0.5)  # 5 tokens
    burst()
    assert len(ran("flow.rate")) == 15
    clock(seconds=0.55)  # half a token more: nothing
    burst()
    assert len(ran("flow.rate")) == 15
    clock(seconds=10)  # the bucket is full again (10), 10 waiting
    burst()
    assert ran("flow.rate") == [f"r{i:02}" for i in range(25)]
    assert statuses("flow.rate") == {SUCCESSFUL: 25}
    assert DeadLetter.objects.count() == 0


def test_burst_size_raises_the_capacity(clock, burst):
    limited = task(name="flow.burst25", rate_limit="10/s", rate_limit_burst=25)(tasks_flow.plain)
    try:
        for i in range(40):
            limited.delay(f"b{i}")
        burst()
        assert Job.objects.filter(task_name="flow.burst25", status=SUCCESSFUL).count() == 25
        clock(seconds=1)
        burst()
        assert Job.objects.filter(task_name="flow.burst25", status=SUCCESSFUL).count() == 35
    finally:
        registry.unregister("flow.burst25")


def test_a_blocked_backlog_does_not_starve_other_tasks(clock, burst, flow):
    for i in range(60):
        flow["flow.rate"].apply_async(args=(f"r{i}",), countdown=0)
    clock(seconds=1)
    for i in range(3):
        flow["flow.plain"].delay(f"p{i}")  # due after all 60 rate-limited jobs

    claimed = claim(limit=4)
    assert [job.task_name for job in claimed] == ["flow.rate"] * 4
    claimed = claim(limit=20)
    # 6 tokens left, then the other task's jobs behind the held-back backlog.
    assert [job.task_name for job in claimed] == ["flow.rate"] * 6 + ["flow.plain"] * 3

    flow["flow.plain"].delay("late")
    # Bucket empty: the rate-limited task is left out of the query; the plain job is found.
    assert [job.args for job in claim(limit=1)] == [["late"]]


def test_gated_claim_query_count_is_bounded(clock, flow):
    for i in range(30):
        flow["flow.rate"].delay(f"r{i}")
    claim(limit=1, worker_id="warm-up")  # creates the TaskState row once
    counts = []
    for limit in (1, 8):
        with CaptureQueriesContext(connection) as ctx:
            assert len(claim(limit=limit, worker_id=f"w{limit}")) == limit
        counts.append(len(ctx.captured_queries))
    # savepoint, estimate (state, running counts), candidates (unlocked), lock states, lock
    # the jobs taken (not on SQLite: it has no row locks), save, claim, release
    assert counts[0] == counts[1] <= 9


# -- rate limit, drop (§6, §8, §9) -----------------------------------------------------------


def test_dropped_jobs_are_shed_with_a_dead_letter_and_no_signal(clock, burst, flow, signal_log):
    jobs = [
        flow["flow.rate_drop"].apply_async(args=(f"d{i:02}",), metadata={"origin": "test", "i": i})
        for i in range(25)
    ]
    signal_log.clear()

    burst()

    assert ran("flow.rate_drop") == [f"d{i:02}" for i in range(10)]
    assert statuses("flow.rate_drop") == {SUCCESSFUL: 10, SHED: 15}
    for i, job in enumerate(jobs[10:], start=10):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at) == (SHED, 0, T)
        assert job.metadata == {"origin": "test", "i": i}  # the row keeps its own metadata
        (letter,) = DeadLetter.objects.filter(job=job)
        assert letter.reason == "shed: rate limit 10/s exceeded"
        assert letter.metadata == {"shed": True, "rate_limit": "10/s", "capacity": 10}
        assert (letter.args, letter.created_at, letter.error) == ([f"d{i:02}"], T, "")
    shed_ids = {job.pk for job in jobs[10:]}
    assert not [entry for entry in signal_log if entry[1]["job"].pk in shed_ids]
    assert len([e for e in signal_log if e[0] == "job_started"]) == 10
    assert len([e for e in signal_log if e[0] == "job_dead_lettered"]) == 0


def test_a_claim_never_sheds_a_job_it_admitted(clock, flow):
    """Regression: a later candidate round must not see (and shed) the jobs admitted earlier."""
    jobs = [flow["flow.rate_drop"].delay(f"d{i:02}") for i in range(40)]
    assert len(claim(limit=8, worker_id="w1")) == 8  # 2 tokens left

    second = claim(limit=10, worker_id="w2")

    assert [job.pk for job in second] == [job.pk for job in jobs[8:10]]
    assert statuses("flow.rate_drop") == {RUNNING: 10, SHED: 30}
    assert not DeadLetter.objects.filter(job__in=[job.pk for job in jobs[:10]]).exists()


def test_a_shed_entry_retried_by_hand_runs(clock, burst, flow):
    for i in range(12):
        flow["flow.rate_drop"].delay(f"d{i}")
    burst()
    letter = DeadLetter.objects.filter(reason__startswith="shed:").order_by("job_id").first()
    assert letter is not None and letter.job.args == ["d10"]

    clock(seconds=1)  # tokens again
    retry = letter.retry()
    assert retry is not None and retry.pk != letter.job_id
    burst()
    retry.refresh_from_db()
    assert retry.status == SUCCESSFUL
    assert ran("flow.rate_drop")[-1] == "d10"
    letter.refresh_from_db()
    assert letter.retry_job_id == retry.pk


# -- B38 ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("workers", [3, 1])
def test_b38_rate_limit_is_deployment_wide(clock, burst, flow, workers):
    """B = capacity = 10 (the N of "10/m"); --burst never waits for a token, it exits (§11)."""
    call_api = flow["b38.call_api"]
    jobs = [call_api.delay(n) for n in range(60)]
    B = 10

    for _ in range(workers):  # run@T on every worker
        burst(concurrency=4)
    assert Job.objects.filter(task_name="b38.call_api").exclude(status=READY).count() == B
    assert started("b38.call_api") == list(range(B))

    for k in range(1, 51):
        clock(seconds=6 * k + 0.001)
        burst(concurrency=4)  # a worker started partway adds no tokens
        if k in (1, 2, 7, 49):
            burst(concurrency=4)  # nor does a second one at the same instant
        assert len(ran("b38.call_api")) == min(60, B + k), k
        waiting = list(Job.objects.filter(task_name="b38.call_api", status=READY).order_by("id"))
        assert [job.pk for job in waiting] == [job.pk for job in jobs[B + k :]]
        assert all(job.run_at == T and job.attempts == 0 for job in waiting)

    assert started("b38.call_api") == list(range(60))
    assert statuses("b38.call_api") == {SUCCESSFUL: 60}
    assert DeadLetter.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_b38_drop_runs_b_and_sheds_the_rest(clock, burst, flow, signal_log):
    call_api = flow["b38.call_api_drop"]
    jobs = [call_api.apply_async(args=(n,), metadata={"n": n}) for n in range(60)]
    signal_log.clear()

    for _ in range(3):
        burst(concurrency=4)

    assert started("b38.call_api_drop") == list(range(10))  # the first B in line
    assert statuses("b38.call_api_drop") == {SUCCESSFUL: 10, SHED: 50}
    letters = {letter.job_id: letter for letter in DeadLetter.objects.all()}
    assert len(letters) == 50
    for job in jobs[10:]:
        job.refresh_from_db()
        assert job.status == SHED and job.attempts == 0 and job.metadata == {"n": job.args[0]}
        assert letters[job.pk].reason.startswith("shed:")
        assert letters[job.pk].metadata["shed"] is True
    assert {entry[1]["job"].pk for entry in signal_log} == {job.pk for job in jobs[:10]}


# -- concurrency (§6) -------------------------------------------------------------------------


def test_concurrency_cap_counts_running_jobs_with_a_live_lease(clock, burst, flow):
    for i in range(7):
        flow["flow.capped"].delay(f"c{i}")
    flow["flow.plain"].delay("p")

    first = claim(limit=10, worker_id="w1")
    assert sorted(job.task_name for job in first) == ["flow.capped"] * 2 + ["flow.plain"]
    assert claim(limit=10, worker_id="w2") == []  # the cap holds across workers

    clock(seconds=30)
    assert claim(limit=10, worker_id="w2") == []
    clock(seconds=60)  # w1 died: its leases lapsed at T+60 and stop counting
    second = claim(limit=10, worker_id="w2")
    assert [job.args for job in second] == [["c2"], ["c3"]]

    # The lapsed jobs go back in line; the cap still holds.
    clock(seconds=121)
    assert reclaim_expired_leases() == (4, 1)  # the plain job had no retry left
    burst()
    assert statuses("flow.capped") == {SUCCESSFUL: 7}


def test_burst_runs_every_capped_job_without_waiting(clock, burst, flow):
    for i in range(5):
        flow["flow.capped"].delay(f"c{i}")
    burst(concurrency=1)
    assert ran("flow.capped") == [f"c{i}" for i in range(5)]


# -- circuit breaker (§6) ------------------------------------------------------------------------


def breaker_state(name: str = "flow.guarded") -> tuple[str, int, dt.datetime | None, int | None]:
    state = TaskState.objects.get(task_name=name)
    return state.breaker_state, state.failures, state.opened_at, state.probe_job_id


def open_breaker(flow: dict[str, Any], burst: Any) -> None:
    letters = DeadLetter.objects.filter(task_name="flow.guarded").count()
    for i in range(3):
        flow["flow.guarded"].delay(f"bad{i}", fail=True)
    burst()
    assert breaker_state() == ("open", 3, T, None)
    assert DeadLetter.objects.filter(task_name="flow.guarded").count() == letters + 3


def test_breaker_opens_defers_then_one_probe_closes_it(clock, burst, flow):
    flow["flow.guarded"].delay("ok-before")
    burst()
    assert breaker_state() == ("closed", 0, None, None)
    flow["flow.guarded"].delay("bad-a", fail=True)
    flow["flow.guarded"].delay("bad-b", fail=True)
    burst()
    assert breaker_state() == ("closed", 2, None, None)
    flow["flow.guarded"].delay("ok-resets")
    burst()
    assert breaker_state() == ("closed", 0, None, None)  # a success resets the count

    open_breaker(flow, burst)
    clock(seconds=1)
    waiting = [flow["flow.guarded"].delay(f"ok{i}") for i in range(3)]
    runs = len(ran("flow.guarded"))
    for seconds in (1, 30, 59.999):
        clock(seconds=seconds)
        burst()
        assert len(ran("flow.guarded")) == runs  # no attempt while open
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.run_at) == (READY, 0, T + S)  # deferred, in place

    clock(seconds=60)  # reset counted from the opening at T
    probe = claim(limit=10)
    assert [job.pk for job in probe] == [waiting[0].pk]  # exactly one probe
    assert breaker_state() == ("half_open", 3, T, waiting[0].pk)
    assert claim(limit=10, worker_id="w2") == []  # nothing else while it runs

    # The probe's worker dies: once its lease lapses it no longer blocks a new probe
    # (max_retries=0: the lapsed probe is dead-lettered; a lost lease is not a failed run).
    clock(seconds=121)
    assert reclaim_expired_leases() == (0, 1)
    assert breaker_state() == ("half_open", 3, T, waiting[0].pk)
    burst()
    assert ran("flow.guarded")[-2:] == ["ok1", "ok2"]  # ok1 probed, closed it; ok2 followed
    assert breaker_state() == ("closed", 0, None, None)
    assert statuses("flow.guarded")[SUCCESSFUL] == 4


def test_a_failed_probe_reopens_the_breaker(clock, burst, flow):
    open_breaker(flow, burst)
    clock(seconds=1)
    flow["flow.guarded"].delay("probe", fail=True)
    flow["flow.guarded"].delay("next")

    clock(seconds=60)
    burst()
    assert ran("flow.guarded")[-1] == "probe"
    assert breaker_state() == ("open", 4, T + 60 * S, None)  # reopened: reset counts again
    clock(seconds=119)
    burst()
    assert ran("flow.guarded")[-1] == "probe"
    clock(seconds=120)
    burst()
    assert ran("flow.guarded")[-1] == "next"
    assert breaker_state() == ("closed", 0, None, None)


def test_retried_failures_count_and_the_open_breaker_defers_retries(clock, burst, flow):
    flaky = flow["flow.guarded_retrying"]
    job = flaky.delay("flaky", fail=True)
    for attempt in range(1, 4):
        burst()
        job.refresh_from_db()
        assert (job.status, job.attempts) == (READY, attempt)  # retried, not buried
        clock(at=job.run_at)
    state, failures, opened_at, _ = breaker_state("flow.guarded_retrying")
    assert (state, failures) == ("open", 3)
    # The retry is due but the breaker is open: no fourth attempt, run_at kept.
    run_at = job.run_at
    clock(at=opened_at + 29 * S)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.run_at) == (READY, 3, run_at)
    clock(at=opened_at + 30 * S)
    burst()  # the probe: the same job, fails again, reopens
    job.refresh_from_db()
    assert job.attempts == 4
    assert breaker_state("flow.guarded_retrying")[:3] == ("open", 4, opened_at + 30 * S)


def test_an_unknown_task_dead_letter_does_not_count(clock, burst, flow):
    from tests.factories import JobFactory

    JobFactory(task_name="flow.not_registered", run_at=T, created_at=T - 11 * 60 * S)
    burst()
    assert DeadLetter.objects.get().reason.startswith("unknown_task:")
    # No row of its own, and no breaker counted it (the claim makes the registered gated
    # tasks' rows, full and closed, decision 148).
    assert not TaskState.objects.filter(task_name="flow.not_registered").exists()
    assert not TaskState.objects.exclude(failures=0, breaker_state="closed").exists()
