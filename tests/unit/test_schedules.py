"""Declaring periodic tasks, and their ticks across DST (docs/howto/periodic-tasks.md, decision 177).

No database: the declaration is checked when the task is decorated, and the
ticks are cronsim's, read in the schedule's zone.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from django_debounce import Schedule, periodic_task, registry, task
from django_debounce.exceptions import ConfigurationError

PARIS = ZoneInfo("Europe/Paris")
UTC = dt.UTC


@pytest.fixture
def names():
    """Task names the test registers; unregistered afterwards (no worker of another test sees them)."""
    taken: list[str] = []
    yield taken
    for name in taken:
        registry.unregister(name)


def paris(*args: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*args, tzinfo=PARIS, fold=fold)


def ticks(schedule: Schedule, start: dt.datetime, count: int) -> list[dt.datetime]:
    found, at = [], start
    for _ in range(count):
        at = schedule.next_after(at)
        found.append(at)
    return found


def test_a_cron_string_and_the_decorator_declare_the_same_schedule(names):
    names += ["per.a", "per.b"]

    @task(name="per.a", schedule="*/5 * * * *")
    def a() -> None: ...

    @periodic_task("0 3 * * *", name="per.b", tz="Europe/Paris", args=(7,), pass_tick=True)
    def b(n: int, tick: dt.datetime) -> None: ...

    (sa,) = a.options.schedule
    assert (sa.name, sa.cron, sa.tz, sa.overlap, sa.pass_tick) == (
        "per.a",
        "*/5 * * * *",
        None,
        False,
        False,
    )
    (sb,) = b.options.schedule
    assert (sb.name, sb.cron, sb.zone.key, sb.args, sb.pass_tick) == (
        "per.b",
        "0 3 * * *",
        "Europe/Paris",
        (7,),
        True,
    )
    # Still an ordinary task: called inline, it runs.
    assert a() is None


@pytest.mark.parametrize(
    "schedule, message",
    [
        (
            "*/5 * * *",
            r"task 'per\.bad': schedule '\*/5 \* \* \*' is not a cron expression .*five fields",
        ),
        ("61 * * * *", r"is not a cron expression"),
        (
            Schedule("0 3 * * *", tz="Europe/Pariss"),
            r"unknown time zone 'Europe/Pariss'; give an IANA name",
        ),
        (Schedule("0 3 * * *", args=(1, 2)), r"args/kwargs do not fit the task's signature"),
        (Schedule("0 3 * * *", kwargs={"when": object()}), r"schedule '0 3 \* \* \*'.*"),
        (Schedule("0 3 * * *", max_lateness="soon"), r"max_lateness='soon' is not a duration"),
        (Schedule("0 3 * * *", name=""), r"name= must be text of 1 to 200 characters"),
        ([Schedule("0 3 * * *"), Schedule("0 4 * * *")], r"two schedules are named .*own name="),
        (42, r"schedule= takes a cron string"),
        (Schedule("0 3 * * *", args="ab"), r"args= must be a tuple or list, got 'ab'"),
        (Schedule("0 3 * * *", kwargs=[("a", 1)]), r"kwargs= must be a dict with str keys"),
    ],
)
def test_a_bad_declaration_raises_naming_the_task_and_the_fix(names, schedule, message):
    with pytest.raises(ConfigurationError, match=message):

        @task(name="per.bad", schedule=schedule)
        def bad(when: object = None) -> None: ...

    assert registry.lookup("per.bad") is None


def test_pass_tick_needs_a_tick_parameter(names):
    with pytest.raises(ConfigurationError, match=r"pass_tick=True passes tick="):

        @periodic_task("* * * * *", name="per.notick", pass_tick=True)
        def notick() -> None: ...


def test_a_schedule_name_belongs_to_one_task(names):
    names += ["per.one"]

    @task(name="per.one", schedule=Schedule("0 3 * * *", name="nightly"))
    def one() -> None: ...

    with pytest.raises(
        ConfigurationError, match=r"\['nightly'\] already belong to task 'per\.one'"
    ):

        @task(name="per.two", schedule=Schedule("0 4 * * *", name="nightly"))
        def two() -> None: ...


def test_a_fixed_time_in_the_skipped_hour_runs_right_after_the_spring_jump():
    # 2026-03-29: Paris goes from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    daily = Schedule("30 2 * * *", tz="Europe/Paris")
    found = ticks(daily, paris(2026, 3, 28, 12, 0), 3)
    assert found == [paris(2026, 3, 29, 3, 0), paris(2026, 3, 30, 2, 30), paris(2026, 3, 31, 2, 30)]
    assert found[0].astimezone(UTC) == dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_a_fixed_time_in_the_repeated_hour_runs_once_in_its_first_occurrence():
    # 2026-10-25: Paris goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    daily = Schedule("30 2 * * *", tz="Europe/Paris")
    found = ticks(daily, paris(2026, 10, 24, 12, 0), 3)
    assert [t.astimezone(UTC) for t in found] == [
        dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
        dt.datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET the next day
        dt.datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]


def test_an_every_half_hour_schedule_follows_the_local_clock_across_both_changes():
    half = Schedule("*/30 * * * *", tz="Europe/Paris")
    spring = ticks(half, paris(2026, 3, 29, 1, 0), 3)
    assert [t.astimezone(UTC).strftime("%H:%M") for t in spring] == ["00:30", "01:00", "01:30"]
    assert [t.strftime("%H:%M%z") for t in spring] == ["01:30+0100", "03:00+0200", "03:30+0200"]
    autumn = ticks(half, paris(2026, 10, 25, 1, 45), 5)
    # Both occurrences of 02:00 and 02:30: four ticks an hour apart in UTC, none twice.
    assert [t.astimezone(UTC).strftime("%H:%M") for t in autumn] == [
        "00:00",
        "00:30",
        "01:00",
        "01:30",
        "02:00",
    ]
    assert [t.strftime("%H:%M%z") for t in autumn] == [
        "02:00+0200",
        "02:30+0200",
        "02:00+0100",
        "02:30+0100",
        "03:00+0100",
    ]


def test_the_zone_defaults_to_time_zone(settings):
    settings.TIME_ZONE = "Europe/Paris"
    nightly = Schedule("0 3 * * *")
    assert nightly.zone.key == "Europe/Paris"
    assert nightly.next_after(dt.datetime(2026, 1, 1, tzinfo=UTC)) == paris(2026, 1, 1, 3, 0)


def test_latest_until_is_the_last_tick_in_the_span():
    every5 = Schedule("*/5 * * * *", tz="UTC")
    start = dt.datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert every5.latest_until(start, start + dt.timedelta(minutes=17)) == start + dt.timedelta(
        minutes=15
    )
    assert every5.latest_until(start, start + dt.timedelta(minutes=4)) is None
