"""A claimed-ahead job obeys every rule at the moment it starts (issue #17 items 2–4; decision 146).

The built-in worker claims ahead once it is busy (its prefetch, decision 121): a
job it claimed may wait in the worker for a thread. These tests run the real
worker (inline ``--burst``, one thread, prefetch on) under a controlled clock: a
warm-up job makes the worker claim ahead, and a slow job moves the clock while
the jobs claimed with it wait. Expiry is judged again when a job reaches its
thread; jobs of a gated task or a CoDel queue are never claimed ahead, so their
token, slot and sojourn are taken at the moment they start. The claim-level
tests pin the rule itself (:func:`django_debounce.flow.start_rules.cut_for_start`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from django_debounce import registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import DeadLetter, Job, TaskState
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.factories import JobFactory
from tests.testapp.models import CallLog

pytestmark = pytest.mark.django_db(transaction=True)

S = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=60)
Status = Job.Status

#: The test's clock mover, for the tasks' bodies (set by the ``tasks`` fixture).
_move: list[Callable[..., dt.datetime]] = []


def _log(name: str, *args: Any) -> None:
    from django.utils import timezone

    CallLog.objects.create(task=name, payload={"args": list(args)}, started_at=timezone.now())


def _noop(*args: Any) -> None:
    _log("rs.noop", *args)


def _slow(seconds: float) -> None:
    """Takes ``seconds`` of the test's clock: the jobs claimed with it wait meanwhile."""
    _log("rs.slow", seconds)
    now = _move[0](at=_now() + dt.timedelta(seconds=seconds))
    assert now > T


def _now() -> dt.datetime:
    from django.utils import timezone

    return timezone.now()


@contextmanager
def registered(name: str, func: Callable[..., Any], **options: Any) -> Iterator[None]:
    task(name=name, **options)(func)
    try:
        yield
    finally:
        registry.unregister(name)


@pytest.fixture
def tasks(clock: Callable[..., dt.datetime]) -> Iterator[None]:
    """``rs.noop`` and ``rs.slow`` (default queue, ungated); the clock frozen at T."""
    _move[:] = [clock]
    with ExitStack() as stack:
        stack.enter_context(registered("rs.noop", _noop))
        stack.enter_context(registered("rs.slow", _slow))
        yield
    _move.clear()


def warm_and_slow(seconds: float = 10) -> tuple[Job, Job]:
    """A warm-up job (due first) and a slow one after it: the worker claims ahead after the first."""
    warm = JobFactory(task_name="rs.noop", args=["warm"], run_at=T - 20 * S)
    slow = JobFactory(task_name="rs.slow", args=[seconds], run_at=T - 19 * S)
    return warm, slow


def run_worker() -> int:
    """The real worker, inline ``--burst`` at concurrency 1, claiming up to 10 jobs ahead."""
    return Worker(
        burst=True, concurrency=1, prefetch=10, handle_signals=False, success_flush_interval=0
    ).run()


def statuses(*jobs: Job) -> list[str]:
    rows = dict(Job.objects.values_list("pk", "status"))
    return [rows[job.pk] for job in jobs]


def test_a_job_claimed_ahead_that_reaches_its_thread_past_its_expiry_ends_expired(tasks):
    """Item 3: 68 of 80 expiring jobs started after their expiry with the default prefetch."""
    warm, slow = warm_and_slow(10)
    expiring = [
        JobFactory(task_name="rs.noop", args=[i], run_at=T - (10 - i) * S, expires_at=T + 5 * S)
        for i in range(3)
    ]
    lasting = JobFactory(task_name="rs.noop", args=["lasting"], run_at=T - 5 * S)
    dependent = JobFactory(task_name="rs.noop", args=["dependent"], run_at=T - 4 * S)
    dependent.dependency_links.create(dependency=expiring[0])

    run_worker()

    assert statuses(warm, slow, *expiring, lasting, dependent) == [
        Status.SUCCESSFUL,
        Status.SUCCESSFUL,
        *[Status.EXPIRED] * 3,
        Status.SUCCESSFUL,
        Status.CANCELLED,
    ]
    for job in expiring:  # as if never claimed: no attempt, no start, ended when it would start
        job.refresh_from_db()
        assert (job.attempts, job.started_at) == (0, None)
        assert job.finished_at == T + 10 * S
    ran = list(CallLog.objects.order_by("pk").values_list("payload", flat=True))
    assert ran == [{"args": ["warm"]}, {"args": [10]}, {"args": ["lasting"]}]
    assert not DeadLetter.objects.exists()  # a planned outcome (§8)


def test_a_rate_limit_counts_starts_not_claims(tasks):
    """Item 4: tokens taken at claim let claimed-ahead jobs start in a bunch past the burst.

    ``2/10s`` holds at most 2 starts at one instant. Before the fix the claim after the
    warm-up took the slow job and two rated jobs (2 tokens at T); they started at T+10,
    when the bucket was full again, and two more started with them: 4 at T+10.
    """
    with registered("rs.rated", _noop, rate_limit="2/10s"):
        warm, slow = warm_and_slow(10)
        rated = [
            JobFactory(task_name="rs.rated", args=[i], run_at=T - (10 - i) * S) for i in range(4)
        ]

        run_worker()

        assert statuses(warm, slow, *rated) == [Status.SUCCESSFUL] * 4 + [Status.READY] * 2
        starts = list(
            Job.objects.filter(task_name="rs.rated", status=Status.SUCCESSFUL).values_list(
                "started_at", flat=True
            )
        )
        assert starts == [T + 10 * S] * 2
        assert TaskState.objects.get(task_name="rs.rated").tokens == 0.0


def test_codel_judges_the_sojourn_of_a_busy_queue_when_each_job_starts(tasks, settings):
    """Item 2: the backlog claimed ahead in one batch was never shed.

    CoDel on ``cq`` (target 500 ms, interval 5 s); six drop-mode jobs due T-8s…T-3s,
    each taking 2 s of the clock, behind a slow job that ends at T+10. Claimed one by
    one as they start: sojourn above target from T+10, so the first drop is due at
    T+15; the job starting at T+16 is shed; the next runs (the drop after it is due at
    T+21), and the last one due runs (nearly empty queue).
    """
    settings.DEBOUNCE_QUEUES = {"cq": {"codel": {"target": "500ms", "interval": "5s"}}}

    def busy(i: int) -> None:
        _log("rs.codel", i)
        _move[0](at=_now() + 2 * S)

    with registered("rs.codel", busy, queue="cq", on_excess="drop"):
        warm, slow = warm_and_slow(10)
        backlog = [
            JobFactory(task_name="rs.codel", queue="cq", args=[i], run_at=T - (8 - i) * S)
            for i in range(6)
        ]

        run_worker()

        assert statuses(*backlog) == [
            Status.SUCCESSFUL,
            Status.SUCCESSFUL,
            Status.SUCCESSFUL,
            Status.SHED,
            Status.SUCCESSFUL,
            Status.SUCCESSFUL,
        ]
        shed = DeadLetter.objects.get()
        assert (shed.job_id, shed.reason.split(":")[0], shed.metadata["codel"]) == (
            backlog[3].pk,
            "codel",
            True,
        )
        assert shed.metadata["sojourn_seconds"] == 21.0  # claimed at T+16, due at T-5


# -- the rule at the claim ---------------------------------------------------------------------


def claim(limit: int, start_now: int | None) -> list[int]:
    jobs = claim_jobs(worker_id="w", limit=limit, lease=LEASE, start_now=start_now)
    return [job.pk for job in jobs]


def test_a_gated_job_is_taken_only_for_a_thread_that_starts_it(clock):
    """Past ``start_now`` the claim takes ungated jobs, and stops before a gated one."""
    with registered("rs.rated", _noop, rate_limit="10/m"):
        free = [JobFactory(args=[i], run_at=T - (20 - i) * S).pk for i in range(3)]
        rated = [
            JobFactory(task_name="rs.rated", args=[i], run_at=T - (10 - i) * S).pk for i in range(2)
        ]
        after = JobFactory(args=["after"], run_at=T).pk

        assert claim(10, start_now=1) == free  # ahead: the ungated ones, up to the gated job
        assert TaskState.objects.get(task_name="rs.rated").tokens is None  # no token taken
        assert claim(10, start_now=1) == rated[:1]  # it starts now; the next gated one waits
        assert claim(10, start_now=2) == [*rated[1:], after]
        assert TaskState.objects.get(task_name="rs.rated").tokens == 8.0


def test_without_start_now_a_claim_takes_every_job_it_may_as_before(clock):
    """``start_now=None`` (the Celery dispatcher, direct callers): all jobs start at once."""
    with registered("rs.rated", _noop, rate_limit="10/m"):
        ids = [JobFactory(task_name="rs.rated", args=[i], run_at=T).pk for i in range(3)]
        assert claim(10, start_now=None) == ids


def test_a_codel_queue_job_is_taken_only_for_a_thread_that_starts_it(clock, settings):
    """The ungated claim (no gated task registered) cuts at a CoDel queue's job too."""
    settings.DEBOUNCE_QUEUES = {"cq": {"codel": {"target": "500ms", "interval": "5s"}}}
    plain = [JobFactory(args=[i], run_at=T - (20 - i) * S).pk for i in range(2)]
    queued = [JobFactory(queue="cq", args=[i], run_at=T - (10 - i) * S).pk for i in range(2)]
    assert claim(10, start_now=1) == plain
    assert claim(10, start_now=1) == queued[:1]
    assert claim(10, start_now=0) == []
    assert claim(10, start_now=1) == queued[1:]
