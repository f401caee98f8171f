"""Deferring periodic ticks: one job per tick, no catch-up storm, no overlap (decisions 177-179).

Under a frozen clock (time-machine, the ``clock`` fixture); the racing
schedulers run in threads on PostgreSQL and MariaDB.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core.management import call_command
from django.db import connections

from django_debounce import Schedule, registry, task
from django_debounce.models import Job, PeriodicTick
from django_debounce.ops.periodic import TAKEN, PeriodicScheduler, defer_tick, registered_schedules
from django_debounce.ops.status import collect_status
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.testapp.models import CallLog

MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def declare():
    """Declare a periodic task for this test only: no other test's worker sees its schedule."""
    names: list[str] = []

    def make(name: str, schedule: object, **options: object):
        def body(*args: object, **kwargs: object) -> None:
            CallLog.objects.create(
                task=name,
                payload={
                    "args": list(args),
                    "kwargs": {
                        k: (v.isoformat() if isinstance(v, dt.datetime) else v)
                        for k, v in kwargs.items()
                    },
                },
            )

        names.append(name)
        return task(name=name, schedule=schedule, **options)(body)

    yield make
    for name in names:
        registry.unregister(name)


def jobs(name: str) -> list[Job]:
    return list(Job.objects.filter(task_name=name).order_by("id"))


@pytest.mark.django_db
def test_each_tick_is_deferred_once_by_a_scheduler(clock, declare):
    declare("per.every5", Schedule("*/5 * * * *", tz="UTC", args=(1,), overlap=True))
    scheduler = PeriodicScheduler(scheduler_id="w1")
    clock(at=T + 2 * MINUTE)  # 12:02: the 12:00 tick is 2 minutes late, within the 10 m cap
    assert scheduler.defer_due() == {"per.every5": "created"}
    assert scheduler.defer_due() == {}  # nothing due until 12:05, and no query for it
    assert scheduler.next_tick() == T + 5 * MINUTE
    clock(at=T + 5 * MINUTE)
    assert scheduler.defer_due() == {"per.every5": "created"}
    rows = list(PeriodicTick.objects.order_by("tick").values_list("tick", "outcome", "deferred_by"))
    assert rows == [(T, "created", "w1"), (T + 5 * MINUTE, "created", "w1")]
    (first, second) = jobs("per.every5")
    assert (first.args, first.queue, first.status) == ([1], "default", Job.Status.READY)
    assert PeriodicTick.objects.get(tick=T).job_id == first.pk
    # A second scheduler starting now finds the tick taken: no second job.
    assert PeriodicScheduler(scheduler_id="w2").defer_due() == {"per.every5": TAKEN}
    assert len(jobs("per.every5")) == 2


@pytest.mark.django_db
def test_after_a_downtime_only_the_latest_missed_tick_runs(clock, declare):
    declare("per.minutely", Schedule("* * * * *", tz="UTC", overlap=True))
    scheduler = PeriodicScheduler()
    clock(at=T)
    assert scheduler.defer_due() == {"per.minutely": "created"}
    # Down for two hours: 120 ticks missed; the latest (14:00), 30 s late, runs, once.
    clock(at=T + 120 * MINUTE + dt.timedelta(seconds=30))
    assert scheduler.defer_due() == {"per.minutely": "created"}
    assert list(PeriodicTick.objects.order_by("tick").values_list("tick", flat=True)) == [
        T,
        T + 120 * MINUTE,
    ]
    assert len(jobs("per.minutely")) == 2


@pytest.mark.django_db
def test_a_tick_later_than_its_cap_is_not_run(clock, declare):
    declare("per.hourly", Schedule("0 * * * *", tz="UTC", max_lateness="5m"))
    clock(at=T + 7 * MINUTE)  # the 12:00 tick is 7 minutes old: past its 5 m cap
    scheduler = PeriodicScheduler()
    assert scheduler.defer_due() == {}  # a start looks back over the cap only
    assert scheduler.next_tick() == T + 60 * MINUTE
    clock(at=T + 60 * MINUTE + 6 * MINUTE)  # a loop that slept past the next cap
    assert scheduler.defer_due() == {"per.hourly": "late"}
    assert jobs("per.hourly") == [] and PeriodicTick.objects.count() == 0


@pytest.mark.django_db
def test_the_setting_caps_the_lateness(clock, declare, settings):
    settings.DEBOUNCE_PERIODIC_MAX_LATENESS = "1h"
    declare("per.daily", Schedule("0 11 * * *", tz="UTC"))
    clock(at=T + 30 * MINUTE)  # 11:00 was 90 minutes ago
    assert PeriodicScheduler().defer_due() == {}
    clock(at=T - 30 * MINUTE)  # 11:30: 30 minutes late, within the hour
    assert PeriodicScheduler().defer_due() == {"per.daily": "created"}


@pytest.mark.django_db
def test_no_overlap_a_tick_waits_for_the_previous_run(clock, declare, burst):
    declare("per.slow", Schedule("*/5 * * * *", tz="UTC"))
    scheduler = PeriodicScheduler()
    clock(at=T)
    assert scheduler.defer_due() == {"per.slow": "created"}
    clock(at=T + 5 * MINUTE)  # the 12:00 job has not run: the 12:05 tick is skipped
    assert scheduler.defer_due() == {"per.slow": "overlap"}
    assert PeriodicTick.objects.get(tick=T + 5 * MINUTE).job_id is None
    assert len(jobs("per.slow")) == 1
    burst()
    clock(at=T + 10 * MINUTE)  # it ran: the next tick runs
    assert scheduler.defer_due() == {"per.slow": "created"}
    assert [j.status for j in jobs("per.slow")] == [Job.Status.SUCCESSFUL, Job.Status.READY]


@pytest.mark.django_db
def test_a_periodic_job_is_an_ordinary_job_of_its_task(clock, declare, burst):
    declare(
        "per.flow",
        Schedule("0 * * * *", tz="Europe/Paris", kwargs={"n": 3}, pass_tick=True),
        queue="mail",
        priority=7,
        rate_limit="10/m",
    )
    clock(at=T + MINUTE)
    assert PeriodicScheduler().defer_due() == {"per.flow": "created"}
    (job,) = jobs("per.flow")
    assert (job.queue, job.priority) == ("mail", 7)
    burst(queues=["mail"])
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    # The tick, in the schedule's zone: 12:00 UTC is 13:00 in Paris in March.
    (log,) = CallLog.objects.filter(task="per.flow")
    assert log.payload == {"args": [], "kwargs": {"n": 3, "tick": "2026-03-01T13:00:00+01:00"}}


@pytest.mark.django_db
def test_a_debounced_periodic_task_joins_its_window(clock, declare):
    declare(
        "per.debounced",
        Schedule("* * * * *", tz="UTC", overlap=True),
        debounce="5m",
        debounce_max_wait="1h",
    )
    scheduler = PeriodicScheduler()
    clock(at=T)
    assert scheduler.defer_due() == {"per.debounced": "created"}
    clock(at=T + MINUTE)
    assert scheduler.defer_due() == {"per.debounced": "debounced"}
    (job,) = jobs("per.debounced")
    assert job.enqueue_count == 2
    assert list(PeriodicTick.objects.values_list("job_id", flat=True)) == [job.pk, job.pk]


@pytest.mark.django_db
def test_the_worker_defers_due_ticks_and_runs_them(clock, declare):
    declare("per.worker", Schedule("*/15 * * * *", tz="UTC", args=("w",)))
    clock(at=T + MINUTE)
    assert Worker(burst=True, handle_signals=False).run() == 1
    assert list(CallLog.objects.filter(task="per.worker").values_list("payload", flat=True)) == [
        {"args": ["w"], "kwargs": {}}
    ]
    assert Worker(burst=True, handle_signals=False, periodic=False).run() == 0
    clock(at=T + 15 * MINUTE)
    assert Worker(burst=True, handle_signals=False, periodic=False).run() == 0
    assert Worker(burst=True, handle_signals=False).run() == 1


@pytest.mark.django_db
def test_an_idle_worker_wakes_at_the_next_tick(clock, declare):
    declare("per.wake", Schedule("*/5 * * * *", tz="UTC"))
    clock(at=T + MINUTE + dt.timedelta(seconds=30))
    scheduler = PeriodicScheduler()
    scheduler.defer_due()
    assert scheduler.cap_wait(1000.0) == pytest.approx(210.01)
    assert scheduler.cap_wait(5.0) == 5.0
    assert PeriodicScheduler(enabled=False).cap_wait(1000.0) == 1000.0


@pytest.mark.django_db
def test_status_lists_the_schedules_with_their_next_and_last_tick(clock, declare):
    declare("per.status", Schedule("*/5 * * * *", tz="UTC", name="five"))
    clock(at=T + MINUTE)
    PeriodicScheduler().defer_due()
    data = collect_status()
    (row,) = [r for r in data["schedules"] if r["name"] == "five"]
    job = jobs("per.status")[0]
    assert row == {
        "name": "five",
        "task": "per.status",
        "cron": "*/5 * * * *",
        "tz": "UTC",
        "next_tick": (T + 5 * MINUTE).isoformat(),
        "last_tick": T.isoformat(),
        "last_outcome": "created",
        "last_job_id": job.pk,
    }
    out = call_command_output("debounce_status")
    assert "five" in out and "*/5 * * * *" in out


def call_command_output(*args: str) -> str:
    from io import StringIO

    buffer = StringIO()
    call_command(*args, stdout=buffer)
    return buffer.getvalue()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_racing_schedulers_insert_one_job_per_tick(clock, declare):
    clock(at=T + 50 * MINUTE)  # every tick within the week its rows are kept
    declare("per.race", Schedule("*/5 * * * *", tz="UTC", overlap=True))
    (periodic,) = [p for p in registered_schedules() if p.name == "per.race"]
    ticks = [T + i * 5 * MINUTE for i in range(10)]
    racers = 4
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []

    def schedule(me: int) -> None:
        try:
            for tick in ticks:
                barrier.wait(10)
                outcomes.append(defer_tick(periodic, tick, scheduler_id=f"s{me}"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=schedule, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == sorted(["created"] * 10 + [TAKEN] * 30)
    assert Job.objects.filter(task_name="per.race").count() == 10
    assert PeriodicTick.objects.count() == 10
    assert sorted(PeriodicTick.objects.values_list("tick", flat=True)) == ticks


@pytest.mark.django_db
def test_a_schedule_gone_from_the_registry_is_not_waited_for(clock, declare):
    declare("per.gone", Schedule("*/5 * * * *", tz="UTC"))
    scheduler = PeriodicScheduler()
    clock(at=T + MINUTE)
    scheduler.defer_due()
    assert scheduler.next_tick() == T + 5 * MINUTE
    registry.unregister("per.gone")
    clock(at=T + 6 * MINUTE)
    assert scheduler.defer_due() == {} and scheduler.next_tick() is None


@pytest.mark.django_db
def test_the_command_line_no_periodic_flag_defers_nothing(clock, declare):
    declare("per.flag", Schedule("*/5 * * * *", tz="UTC"))
    clock(at=T + MINUTE)
    call_command("run_debounce_worker", "--burst", "--no-periodic")
    assert jobs("per.flag") == []
    call_command("run_debounce_worker", "--burst")
    assert [j.status for j in jobs("per.flag")] == [Job.Status.SUCCESSFUL]


@pytest.mark.django_db
def test_a_won_tick_deletes_the_schedules_ticks_older_than_a_week(clock, declare):
    declare("per.daily_a", Schedule("0 12 * * *", tz="UTC", overlap=True))
    declare("per.daily_b", Schedule("0 12 * * *", tz="UTC", overlap=True))
    scheduler = PeriodicScheduler()
    for day in range(9):
        clock(at=T + dt.timedelta(days=day, seconds=1))
        scheduler.defer_due()
    for name in ("per.daily_a", "per.daily_b"):
        kept = PeriodicTick.objects.filter(schedule=name).order_by("tick")
        # Day 8's tick, deferred at 12:00:01, deleted the rows older than 7 days: days 0 and 1.
        assert list(kept.values_list("tick", flat=True)) == [
            T + dt.timedelta(days=day) for day in range(2, 9)
        ]
        assert Job.objects.filter(task_name=name).count() == 9


@pytest.mark.django_db
def test_status_gives_ticks_in_utc_and_a_schedule_line_fits_the_width(clock, declare):
    """A Paris schedule's next and last tick are both UTC instants (as every other instant of
    the status), and its text line, with the outcome, fits an 80-column terminal."""
    from django_debounce.ops.status import render_status

    name = "a.rather.long.schedule.name.for.the.nightly.report"
    declare("per.paris", Schedule("0 * * * *", tz="Europe/Paris", name=name))
    clock(at=T + MINUTE)
    PeriodicScheduler().defer_due()
    data = collect_status()
    (row,) = [r for r in data["schedules"] if r["name"] == name]
    assert row["next_tick"] == (T + 60 * MINUTE).isoformat()
    assert row["last_tick"] == T.isoformat()
    (line,) = [line for line in render_status(data, width=80).splitlines() if "0 * * * *" in line]
    assert len(line) <= 80 and line.endswith(" created"), line
