"""CoDel per queue at claim time, under the controlled clock (§6, §8, §11; field report B40).

Queue ``search`` runs CoDel with target 5 s and interval 1 m. ``codel.refresh_s``
(``on_excess="drop"``) may be shed; ``codel.bill`` (``defer``) never is. A
"run" is ``run_debounce_worker --burst --max-jobs 1`` at the frozen instant,
and the B40 drain moves the clock 1 s after each run.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce import registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import DeadLetter, Job, QueueState
from tests.conftest import T
from tests.factories import DeadLetterFactory
from tests.testapp.models import CallLog
from tests.testapp.tasks_codel import bill, refresh_debounced, refresh_s

pytestmark = pytest.mark.django_db

SEARCH = {"search": {"codel": {"target": "5s", "interval": "1m"}}}


@pytest.fixture(autouse=True)
def codel_on(settings):
    settings.DEBOUNCE_QUEUES = SEARCH


def at(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


def drain(clock, burst, *, start: float, limit: int = 2000) -> float:
    """From ``start`` s after T, run one job per second until nothing is READY; return the end."""
    second = start
    for _ in range(limit):
        if not Job.objects.filter(status=Job.Status.READY).exists():
            return second
        clock(seconds=second)
        burst(max_jobs=1)
        second += 1
    raise AssertionError(f"queue not drained after {limit} runs")


def ran(task_name: str) -> list[int]:
    """The argument ``n`` of every run of ``task_name``, in run order."""
    return [row.payload["n"] for row in CallLog.objects.filter(task=task_name).order_by("id")]


def codel_letters() -> list[DeadLetter]:
    return list(DeadLetter.objects.order_by("id"))


def assert_shed_by_codel(letters: list[DeadLetter]) -> None:
    """Every letter is CoDel's: SHED job, one letter each, ``codel:`` prefix, metadata."""
    for letter in letters:
        assert letter.reason.startswith("codel: waited ")
        assert letter.metadata["codel"] is True
        assert letter.metadata["target_seconds"] == 5.0
        assert letter.metadata["interval_seconds"] == 60.0
        assert letter.metadata["sojourn_seconds"] >= 5.0
        assert letter.job.status == Job.Status.SHED
        assert letter.job.finished_at == letter.created_at
        assert letter.job.dead_letters.count() == 1
        assert letter.task_name == "codel.refresh_s" and letter.queue == "search"


def test_b40_codel_sheds_stale_backlog(clock, burst, signal_log):
    """B40: 300 refresh_s and 30 bill calls spread over T…T+10m, drained from T+10m at one
    run per second: every bill runs, refresh_s run + shed = 300, and CoDel sheds 8."""
    for i in range(300):
        clock(seconds=2 * i)  # every 2 s: T, T+2s, …, T+9m58s
        refresh_s.delay(i)
        if i % 10 == 0:  # every 20 s: T, T+20s, …, T+9m40s
            bill.delay(i // 10)
    assert Job.objects.filter(queue="search").count() == 330
    signal_log.clear()

    end = drain(clock, burst, start=600)

    assert sorted(ran("codel.bill")) == list(range(30))
    assert set(Job.objects.filter(task_name="codel.bill").values_list("status", flat=True)) == {
        Job.Status.SUCCESSFUL
    }
    refreshed = ran("codel.refresh_s")
    letters = codel_letters()
    shed = [letter.job.args[0] for letter in letters]
    assert len(refreshed) + len(shed) == 300
    assert sorted(refreshed + shed) == list(range(300))  # no job both run and shed
    assert_shed_by_codel(letters)
    # Measured (docs/reference/settings.md): the first drop one interval after the first
    # claim (T+10m), then 60/√2, 60/√3, … s after the previous scheduled drop, one second
    # later when the job at hand is a bill (the drop waits for the next refresh_s), until
    # the queue drains at T+15m22s.
    assert len(shed) == 8
    assert [(letter.created_at - T).total_seconds() for letter in letters] == [
        660.0,
        720.0,
        763.0,
        798.0,
        829.0,
        854.0,
        879.0,
        903.0,
    ]
    assert [letter.metadata["drop_count"] for letter in letters] == list(range(1, 9))
    assert letters[0].metadata["sojourn_seconds"] == 552.0  # refresh_s(54), due at T+108s
    # No signal for a shed (§9): only the runs started and finished.
    started = [entry for entry in signal_log if entry[0] == "job_started"]
    assert len(started) == 322
    assert not [entry for entry in signal_log if entry[0] == "job_dead_lettered"]
    # The queue drained; its last job left the dropping state (queue nearly empty).
    state = QueueState.objects.get(queue="search")
    assert not state.dropping and state.first_above_at is None
    assert end == 600 + 322


def test_codel_sustained_backlog_sheds_on_schedule(clock, burst):
    """170 jobs all due at T, claimed one per second from T+8s: the wait is over target
    from the first claim, so the first drop comes one interval later, then 60/√count apart."""
    for i in range(170):
        refresh_s.delay(i)

    drain(clock, burst, start=8)

    letters = codel_letters()
    assert_shed_by_codel(letters)
    drop_times = [(letter.created_at - T).total_seconds() for letter in letters]
    # First claim T+8s → first_above T+68s; drops at 68, then 68+60 = 128, 128+42.43 → 171.
    assert drop_times == [68.0, 128.0, 171.0]
    assert [letter.metadata["sojourn_seconds"] for letter in letters] == drop_times
    assert len(ran("codel.refresh_s")) == 167


def test_b40_short_spike_sheds_nothing(clock, burst):
    """B40: 20 refresh_s jobs due at T and claimed at T+8s are over target for less than
    the interval: none is shed."""
    for i in range(20):
        refresh_s.delay(i)
    clock(seconds=8)

    burst()

    assert sorted(ran("codel.refresh_s")) == list(range(20))
    assert DeadLetter.objects.count() == 0
    state = QueueState.objects.get(queue="search")
    assert not state.dropping and state.first_above_at is None  # the spike drained


def test_a_spike_drained_within_the_interval_sheds_nothing(clock, burst):
    """50 jobs due at T, one claimed per second from T+8s: above target for 50 s < 1 m."""
    for i in range(50):
        refresh_s.delay(i)

    drain(clock, burst, start=8)

    assert len(ran("codel.refresh_s")) == 50
    assert DeadLetter.objects.count() == 0


def test_b40_wait_counts_from_run_at(clock, burst):
    """B40: in an idle queue, a debounced drop-task job whose window was open 4 minutes and
    that is claimed 1 s after run_at is not shed: its wait is 1 s, not 4½ minutes."""
    for call in range(13):  # T, T+20s, …, T+4m: the window slides to T+4m30s
        clock(seconds=20 * call)
        refresh_debounced.delay("u1", n=call)
    (job,) = Job.objects.all()
    assert job.run_at == at(270) and job.opened_at == T
    clock(seconds=271)

    burst()

    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    assert DeadLetter.objects.count() == 0
    assert QueueState.objects.get(queue="search").first_above_at is None


def test_wait_counts_from_run_at_when_the_law_is_ready_to_drop(clock):
    """The same job with the queue above target for a full interval already and two bill
    jobs due behind it: the law would shed anything above target, yet a 1 s wait runs."""
    for call in range(13):
        clock(seconds=20 * call)
        refresh_debounced.delay("u1", n=call)
    clock(seconds=270.5)
    bill.delay(1)
    bill.delay(2)
    QueueState.objects.create(queue="search", first_above_at=T)  # above target since T
    clock(seconds=271)

    claimed = claim_jobs(worker_id="w", limit=1, lease=dt.timedelta(minutes=1))

    assert [job.task_name for job in claimed] == ["codel.refresh_debounced"]
    assert DeadLetter.objects.count() == 0
    # A job of the same window age whose run_at were 4½ minutes back would be shed:
    late = refresh_s.delay(99)
    Job.objects.filter(pk=late.pk).update(run_at=T)
    QueueState.objects.filter(queue="search").update(first_above_at=T)  # the 1 s wait reset it
    claimed = claim_jobs(worker_id="w", limit=1, lease=dt.timedelta(minutes=1))
    assert [job.task_name for job in claimed] == ["codel.bill"]
    (letter,) = codel_letters()
    assert letter.job_id == late.pk and letter.metadata["sojourn_seconds"] == 271.0


def test_b40_codel_entry_manual_retry(clock, burst, settings):
    """B40: the auto-sweep skips a codel: entry; DeadLetter.retry() works on it: a fresh
    job, linked, that runs."""
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = {"every": "1m", "min_age": "1m", "max_retries": 3}
    for i in range(70):
        refresh_s.delay(i)
    drain(clock, burst, start=8)  # one shed at T+68s
    (letter,) = codel_letters()
    shed_n = letter.job.args[0]
    assert shed_n not in ran("codel.refresh_s")
    failed = DeadLetterFactory(  # a control the sweep does retry
        job__task_name="codel.bill", job__queue="search", job__args=[99], created_at=at(68)
    )
    clock(seconds=600)
    burst()  # sweeps first: both entries are 9 minutes old; the codel: one is reserved (§8)
    letter.refresh_from_db()
    failed.refresh_from_db()
    assert letter.retried_at is None
    assert failed.retried_at == at(600) and ran("codel.bill") == [99]

    job = letter.retry()

    assert job is not None and job.pk != letter.job_id
    assert job.status == Job.Status.READY and job.queue == "search" and job.args == [shed_n]
    letter.refresh_from_db()
    assert letter.retry_job_id == job.pk and letter.retried_at == at(600)
    burst()
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    assert ran("codel.refresh_s").count(shed_n) == 1


def test_defer_tasks_are_never_shed_and_the_drop_moves_to_the_next_droppable_job(clock, burst):
    """At the moment the law drops, bill jobs (defer) run; the drop falls on refresh_s."""
    for i in range(70):
        bill.delay(i)
    clock(seconds=0.5)
    for i in range(5):
        refresh_s.delay(i)

    drain(clock, burst, start=8)

    assert sorted(ran("codel.bill")) == list(range(70))
    (letter,) = codel_letters()
    # The law was ready at T+68s, on a bill job; the first refresh_s (claimed at T+78s) took it.
    assert letter.job.args == [0] and letter.created_at == at(78)
    assert sorted(ran("codel.refresh_s")) == [1, 2, 3, 4]


def test_queues_without_codel_are_untouched(clock, burst, settings):
    settings.DEBOUNCE_QUEUES = {"other": {"codel": {"target": "5s", "interval": "1m"}}}
    for i in range(100):
        refresh_s.delay(i)

    drain(clock, burst, start=600)

    assert len(ran("codel.refresh_s")) == 100
    assert DeadLetter.objects.count() == 0
    assert not QueueState.objects.exists()


@pytest.mark.parametrize("queues", [{}, {"other": {"codel": {"target": "5s", "interval": "1m"}}}])
def test_a_claim_outside_codel_queues_adds_no_query(clock, settings, queues):
    """Fast path: without CoDel on the claimed jobs' queue, the claim costs what it cost
    without the feature."""
    for i in range(4):
        refresh_s.delay(i)
    clock(seconds=600)
    settings.DEBOUNCE_QUEUES = None
    with CaptureQueriesContext(connection) as plain:
        claim_jobs(worker_id="w", limit=1, lease=dt.timedelta(minutes=1))
    settings.DEBOUNCE_QUEUES = queues
    with CaptureQueriesContext(connection) as ctx:
        claim_jobs(worker_id="w", limit=1, lease=dt.timedelta(minutes=1))
    assert len(ctx.captured_queries) == len(plain.captured_queries)
    assert not any("queuestate" in q["sql"].lower() for q in ctx.captured_queries)


@pytest.fixture
def limited():
    """A rate-limited drop task in queue ``search``, registered for one test only (a gated
    task makes every claim go through admission)."""

    def refresh_limited(n: int) -> None:
        CallLog.objects.create(task="codel.limited", payload={"n": n})

    yield task(
        name="codel.limited", queue="search", rate_limit="1/m", on_excess="drop", max_retries=0
    )(refresh_limited)
    registry.unregister("codel.limited")


def test_codel_composes_with_a_rate_limit_in_the_same_claim(clock, burst, limited):
    """Admission sheds the rate-limited jobs without a token (``shed:``) and CoDel then
    sheds by its law (``codel:``), in the same claims; everything is run or shed once."""
    for i in range(3):
        limited.delay(i)
    for i in range(70):
        refresh_s.delay(i)

    drain(clock, burst, start=8)

    letters = codel_letters()
    by_prefix = {
        prefix: sorted(
            (letter.task_name, letter.args[0])
            for letter in letters
            if letter.reason.startswith(prefix)
        )
        for prefix in ("shed:", "codel:")
    }
    assert by_prefix["shed:"] == [("codel.limited", 1), ("codel.limited", 2)]
    assert [task_name for task_name, _ in by_prefix["codel:"]] == ["codel.refresh_s"]
    assert ran("codel.limited") == [0]
    shed_refresh = [n for _, n in by_prefix["codel:"]]
    assert sorted(ran("codel.refresh_s") + shed_refresh) == list(range(70))
    assert (
        len(letters) == 3
        and not Job.objects.exclude(status__in=[Job.Status.SUCCESSFUL, Job.Status.SHED]).exists()
    )
