"""Periodic tasks combined with edges, clocks, skewed schedulers and bad input (attack, 177-180).

Under a frozen clock (time-machine, the ``clock`` fixture). Three of these
pinned defects as strict xfails, fixed by decisions 191-192: a scheduler whose
clock is behind, a schedule whose arguments cannot resolve the task's key, bad
schedule flags.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connections

from django_debounce import Schedule, registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job, PeriodicTick
from django_debounce.ops.periodic import (
    STALE,
    TAKEN,
    PeriodicScheduler,
    defer_tick,
    registered_schedules,
)
from tests.conftest import T

MINUTE = dt.timedelta(minutes=1)
WINDOW = {"debounce": "5m", "debounce_max_wait": "30m"}


@pytest.fixture
def declare():
    """Declare a periodic task for this test only: no other test's worker sees its schedule."""
    names: list[str] = []

    def make(name: str, schedule: object, **options: object):
        def body(*args: object, **kwargs: object) -> None:
            return None

        names.append(name)
        return task(name=name, schedule=schedule, **options)(body)

    yield make
    for name in names:
        registry.unregister(name)


def jobs(name: str) -> list[tuple[int, str]]:
    return list(Job.objects.filter(task_name=name).order_by("id").values_list("pk", "status"))


@pytest.mark.django_db
def test_a_leading_periodic_task_runs_its_first_tick_at_once_and_swallows_the_burst(
    clock, declare, burst
):
    declare("atk.per.lead", Schedule("* * * * *", tz="UTC"), debounce_edge="leading", **WINDOW)
    scheduler = PeriodicScheduler(scheduler_id="w1")
    clock(at=T + dt.timedelta(seconds=1))
    assert scheduler.defer_due() == {"atk.per.lead": "created"}
    burst()
    clock(at=T + MINUTE + dt.timedelta(seconds=1))
    # The previous tick's job ran (no overlap): the tick joins the open burst, swallowed.
    assert scheduler.defer_due() == {"atk.per.lead": "debounced"}
    burst()
    assert [status for _, status in jobs("atk.per.lead")] == ["SUCCESSFUL"]


@pytest.mark.django_db
def test_a_both_periodic_task_without_overlap_skips_ticks_while_its_trailing_job_waits(
    clock, declare, burst
):
    declare("atk.per.both", Schedule("* * * * *", tz="UTC"), debounce_edge="both", **WINDOW)
    scheduler = PeriodicScheduler(scheduler_id="w1")
    outcomes = []
    for minute in range(8):
        clock(at=T + minute * MINUTE + dt.timedelta(seconds=1))
        outcomes.append(str(scheduler.defer_due()["atk.per.both"]))
        burst()
    # t0 leads; t1 creates the trailing job, due t1 + 5m = 12:06:01; t2..t6 are skipped while
    # it waits (t6 is deferred before the worker runs it); t7 leads a new burst.
    assert outcomes == ["created", "created"] + ["overlap"] * 5 + ["created"]
    assert [status for _, status in jobs("atk.per.both")] == ["SUCCESSFUL"] * 3


@pytest.mark.django_db
def test_a_leading_periodic_job_waiting_for_a_retry_makes_the_next_tick_skip(clock, declare):
    declare(
        "atk.per.retry",
        Schedule("* * * * *", tz="UTC"),
        debounce_edge="leading",
        max_retries=3,
        **WINDOW,
    )
    scheduler = PeriodicScheduler(scheduler_id="w1")
    clock(at=T + dt.timedelta(seconds=1))
    scheduler.defer_due()
    (job,) = claim_jobs(worker_id="w1", limit=1, lease=dt.timedelta(minutes=5))
    Job.objects.filter(pk=job.pk).update(status="READY", run_at=T + 10 * MINUTE, attempts=1)
    clock(at=T + MINUTE + dt.timedelta(seconds=1))
    assert scheduler.defer_due() == {"atk.per.retry": "overlap"}
    Job.objects.filter(pk=job.pk).update(status="FAILED", finished_at=T + MINUTE)
    clock(at=T + 2 * MINUTE + dt.timedelta(seconds=1))
    # Dead-lettered: its burst is closed, so the tick opens a new one and runs at once.
    assert scheduler.defer_due() == {"atk.per.retry": "created"}
    assert [status for _, status in jobs("atk.per.retry")] == ["FAILED", "READY"]


@pytest.mark.django_db
def test_a_scheduler_behind_the_clock_never_defers_a_tick_before_one_already_deferred(
    clock, declare
):
    declare("atk.per.skew", Schedule("* * * * *", tz="UTC"))
    clock(at=T + 5 * MINUTE + dt.timedelta(seconds=10))
    assert PeriodicScheduler(scheduler_id="ahead").defer_due() == {"atk.per.skew": "created"}
    claim_jobs(worker_id="w1", limit=1, lease=dt.timedelta(minutes=5))  # 12:05's job runs
    clock(at=T + 4 * MINUTE + dt.timedelta(seconds=50))  # 20 s behind
    outcome = PeriodicScheduler(scheduler_id="behind").defer_due()
    assert outcome == {"atk.per.skew": STALE}
    assert [status for _, status in jobs("atk.per.skew")] == ["RUNNING"]


@pytest.mark.django_db
def test_the_clock_jumping_forward_runs_one_job_for_the_latest_tick(clock, declare):
    declare("atk.per.jump", Schedule("* * * * *", tz="UTC", overlap=True))
    scheduler = PeriodicScheduler(scheduler_id="w1")
    clock(at=T + dt.timedelta(seconds=1))
    assert scheduler.defer_due() == {"atk.per.jump": "created"}
    clock(at=T + 9 * MINUTE + dt.timedelta(seconds=30))
    assert scheduler.defer_due() == {"atk.per.jump": "created"}
    assert list(PeriodicTick.objects.order_by("tick").values_list("tick", flat=True)) == [
        T,
        T + 9 * MINUTE,
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("edge", ["leading", "both"])
def test_racing_schedulers_defer_one_leading_job_per_tick(clock, declare, edge):
    """Four schedulers (threads, own connections) race each tick of a leading/both task."""
    clock(at=T + 50 * MINUTE)
    name = f"atk.per.race.{edge}"
    declare(name, Schedule("*/5 * * * *", tz="UTC", overlap=True), debounce_edge=edge, **WINDOW)
    (periodic,) = [p for p in registered_schedules() if p.name == name]
    ticks = [T + i * 5 * MINUTE for i in range(6)]
    racers = 4
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def schedule(me: int) -> None:
        try:
            for tick in ticks:
                barrier.wait(10)
                outcomes.append(defer_tick(periodic, tick, scheduler_id=f"s{me}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=schedule, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert outcomes.count(TAKEN) == 18 and len(outcomes) == 24
    # Every tick's call was made at one instant (T+50m): one burst, one leading job,
    # and for "both" one trailing job gathering the rest.
    expected = 1 if edge == "leading" else 2
    assert Job.objects.filter(task_name=name).count() == expected
    assert PeriodicTick.objects.filter(schedule=name).count() == 6


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"overlap": "no"}, r"overlap"),
        ({"pass_tick": "no"}, r"pass_tick"),
        ({"tz": ""}, r"time zone"),
    ],
)
def test_bad_schedule_flags_are_refused(options, match):
    with pytest.raises(ConfigurationError, match=match):
        task(name="atk.per.bad", schedule=Schedule("* * * * *", **options))(lambda tick=None: None)
    registry.unregister("atk.per.bad")


@pytest.mark.django_db
def test_a_schedule_whose_arguments_cannot_resolve_the_key_is_refused_at_import(clock):
    def body(**kwargs: object) -> None:
        return None

    name = "atk.per.badkey"
    try:
        with pytest.raises(ConfigurationError, match="debounce_key"):
            task(
                name=name,
                schedule=Schedule("* * * * *", tz="UTC"),
                debounce_key="x:{user}",
                debounce_edge="leading",
                **WINDOW,
            )(body)
    finally:
        clock(at=T + dt.timedelta(seconds=1))
        outcome = PeriodicScheduler(scheduler_id="w1").defer_due().get(name)
        registry.unregister(name)
        assert outcome in (None, "created"), outcome


@pytest.mark.django_db(transaction=True)
def test_schedulers_racing_two_ticks_never_run_both(clock, declare):
    """A scheduler ahead (12:05) and one behind (12:04) race, after 12:03's row: one job."""
    clock(at=T + 5 * MINUTE + dt.timedelta(seconds=1))
    name = "atk.per.skewrace"
    declare(name, Schedule("* * * * *", tz="UTC"))
    (periodic,) = [p for p in registered_schedules() if p.name == name]
    assert defer_tick(periodic, T + 3 * MINUTE) == "created"
    Job.objects.filter(task_name=name).update(status="SUCCESSFUL")
    barrier = threading.Barrier(2)
    outcomes: dict[dt.datetime, str] = {}
    errors: list[BaseException] = []

    def schedule(tick: dt.datetime) -> None:
        try:
            barrier.wait(10)
            outcomes[tick] = defer_tick(periodic, tick, scheduler_id=str(tick))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    ticks = [T + 4 * MINUTE, T + 5 * MINUTE]
    threads = [threading.Thread(target=schedule, args=(tick,)) for tick in ticks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    # Either 12:05 went first (12:04 is stale) or 12:04 did (12:05 skips while its job waits).
    assert sorted(outcomes.values()) in (["created", STALE], ["created", "overlap"])
    assert Job.objects.filter(task_name=name, status="READY").count() == 1


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"overlap": 1}, r"overlap= takes True or False, got 1"),
        ({"tz": "   "}, r"tz= takes a time zone"),
        ({"tz": 3}, r"tz= takes a time zone"),
    ],
)
def test_other_bad_schedule_flags_are_refused(options, match):
    with pytest.raises(ConfigurationError, match=match):
        task(name="atk.per.bad2", schedule=Schedule("* * * * *", **options))(lambda: None)
    assert "atk.per.bad2" not in registry.all_tasks()


@pytest.mark.django_db
def test_a_tzinfo_is_a_time_zone(clock, declare):
    declare("atk.per.tzinfo", Schedule("30 * * * *", tz=dt.timezone(dt.timedelta(hours=2))))
    clock(at=T + 30 * MINUTE + dt.timedelta(seconds=1))
    assert PeriodicScheduler(scheduler_id="w1").defer_due() == {"atk.per.tzinfo": "created"}


def test_a_key_refusal_names_the_schedule_the_template_and_the_argument():
    with pytest.raises(ConfigurationError) as refused:
        task(
            name="atk.per.badunique",
            schedule=Schedule("* * * * *", tz="UTC", name="nightly", kwargs={"team": 1}),
            unique_key="u:{team}:{user}",
        )(lambda team, **kw: None)
    message = str(refused.value)
    assert "'nightly'" in message and "unique_key 'u:{team}:{user}'" in message, message
    assert "uses {user}, which is not an argument" in message, message
    assert "atk.per.badunique" not in registry.all_tasks()


def test_a_key_may_use_the_tick_under_pass_tick_only(declare):
    def body(tick: dt.datetime | None = None) -> None:
        return None

    declare(
        "atk.per.tickkey", Schedule("* * * * *", tz="UTC", pass_tick=True), unique_key="t:{tick}"
    )
    with pytest.raises(ConfigurationError, match=r"unique_key 't:\{missing\}'.*\{missing\}"):
        task(
            name="atk.per.tickkey2",
            schedule=Schedule("* * * * *", tz="UTC", pass_tick=True),
            unique_key="t:{missing}",
        )(body)
    assert "atk.per.tickkey2" not in registry.all_tasks()
