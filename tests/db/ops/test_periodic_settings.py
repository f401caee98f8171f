"""Schedules declared in settings (``DEBOUNCE_SCHEDULES``, decision 209): the same ticks as in code.

Under a frozen clock (the ``clock`` fixture, T = 12:00 UTC). Each test declares its
tasks on demand and overrides the setting, so no other test's scheduler sees them.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_debounce import Schedule, registry, task
from django_debounce.checks.periodic import check_settings_schedules
from django_debounce.checks.settings import check_settings
from django_debounce.models import Job, PeriodicTick
from django_debounce.ops.periodic import PeriodicScheduler, registered_schedules
from django_debounce.ops.status import collect_status
from django_debounce.worker.loop import Worker
from tests.conftest import T
from tests.testapp.models import CallLog

MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def declare():
    """Declare a task for this test only (a body that logs its call)."""
    names: list[str] = []

    def make(name: str, **options: object):
        def body(kind: str = "", *, full: bool = False, tick: object = None) -> None:
            CallLog.objects.create(task=name, payload={"kind": kind, "full": full})

        def keyed(*, user: str) -> None:  # a key template needs user=
            CallLog.objects.create(task=name, payload={"user": user})

        names.append(name)
        return task(name=name, **options)(keyed if "debounce_key" in options else body)

    yield make
    for name in names:
        registry.unregister(name)


def errors_of(value: object) -> list[tuple[str, str, str]]:
    """(id, obj, message) of the E047/E048 errors ``manage.py check`` gives for ``value``."""
    with override_settings(DEBOUNCE_SCHEDULES=value):
        found = [e for e in check_settings() if e.id == "django_debounce.E047"]
        found += check_settings_schedules()
    return [(e.id, str(e.obj), e.msg) for e in found]


@pytest.mark.django_db
def test_a_schedule_in_settings_ticks_as_one_in_code(clock, declare):
    declare("set.report")
    value = {
        "set-nightly": {"task": "set.report", "cron": "0 13 * * *", "tz": "Europe/Paris"},
        "set-half": {
            "task": "set.report",
            "cron": "*/30 * * * *",
            "args": ["half"],
            "kwargs": {"full": True},
            "overlap": True,
            "max_lateness": "5m",
        },
    }
    with override_settings(DEBOUNCE_SCHEDULES=value):
        names = {p.name: p.task.name for p in registered_schedules()}
        assert {k: v for k, v in names.items() if k.startswith("set-")} == {
            "set-half": "set.report",
            "set-nightly": "set.report",
        }
        clock(at=T + 2 * MINUTE)  # 12:02 UTC = 13:02 in Paris (CET): both ticks are due
        scheduler = PeriodicScheduler(scheduler_id="w1")
        assert scheduler.defer_due() == {"set-half": "created", "set-nightly": "created"}
        assert scheduler.defer_due() == {}
        ticks = PeriodicTick.objects.order_by("schedule").values_list("schedule", "tick")
        assert list(ticks) == [("set-half", T), ("set-nightly", T)]
        half, nightly = Job.objects.filter(task_name="set.report").order_by("id")
        assert (half.args, half.kwargs) == (["half"], {"full": True})
        assert (nightly.args, nightly.kwargs) == ([], {})
        # 5 m lateness cap on set-half: at 12:36 the 12:30 tick is 6 minutes old.
        clock(at=T + 36 * MINUTE)
        assert scheduler.defer_due() == {"set-half": "late"}
        rows = {r["name"]: r for r in collect_status()["schedules"]}
        assert rows["set-nightly"]["next_tick"] == (T + 24 * 60 * MINUTE).isoformat()
        assert rows["set-half"]["last_tick"] == T.isoformat()


@pytest.mark.django_db
def test_the_worker_runs_the_ticks_of_settings_schedules(clock, declare):
    declare("set.worker")
    value = {
        "set-quarter": {"task": "set.worker", "cron": "*/15 * * * *", "tz": "UTC", "args": ["w"]}
    }
    with override_settings(DEBOUNCE_SCHEDULES=value):
        clock(at=T + MINUTE)
        assert Worker(burst=True, handle_signals=False).run() == 1
        assert Worker(burst=True, handle_signals=False).run() == 0
    assert list(CallLog.objects.values_list("task", "payload")) == [
        ("set.worker", {"kind": "w", "full": False})
    ]
    clock(at=T + 15 * MINUTE)  # the setting gone: the schedule is too
    assert Worker(burst=True, handle_signals=False).run() == 0


@pytest.mark.django_db
def test_the_shape_is_checked_as_e047():
    good = {"a": {"task": "t", "cron": "* * * * *"}}
    assert errors_of(good) == [
        (
            "django_debounce.E048",
            "DEBOUNCE_SCHEDULES['a']",
            "DEBOUNCE_SCHEDULES['a']: no task named 't' is registered. A task's name is its "
            "module and function ('reports.tasks.build_report') unless name= gave another; "
            "its module must be imported at startup (a tasks.py of an installed app is).",
        )
    ]
    cases = {
        "not a dict": ["every minute"],
        "entry not a dict": {"a": "* * * * *"},
        "unknown key": {"a": {"task": "t", "cron": "* * * * *", "every": 5}},
        "no task": {"a": {"cron": "* * * * *"}},
        "empty cron": {"a": {"task": "t", "cron": " "}},
        "args a string": {"a": {"task": "t", "cron": "* * * * *", "args": "x"}},
        "kwargs keys": {"a": {"task": "t", "cron": "* * * * *", "kwargs": {1: 2}}},
        "overlap a string": {"a": {"task": "t", "cron": "* * * * *", "overlap": "no"}},
        "empty name": {"": {"task": "t", "cron": "* * * * *"}},
        "empty tz": {"a": {"task": "t", "cron": "* * * * *", "tz": ""}},
    }
    wanted = {
        "not a dict": "must be a dict of schedule name -> schedule",
        "entry not a dict": "DEBOUNCE_SCHEDULES['a']='* * * * *' must be a dict",
        "unknown key": "DEBOUNCE_SCHEDULES['a']: unknown key(s) ['every']; accepted: task, cron,",
        "no task": "DEBOUNCE_SCHEDULES['a']: 'task' is required and must be a non-empty str",
        "empty cron": "DEBOUNCE_SCHEDULES['a']: 'cron' is required",
        "args a string": "DEBOUNCE_SCHEDULES['a']: 'args' must be a list or tuple, got 'x'.",
        "kwargs keys": "'kwargs' must be a dict with str keys, got {1: 2}.",
        "overlap a string": "'overlap' takes True or False, got 'no'.",
        "empty name": "DEBOUNCE_SCHEDULES['']: a schedule name must be text of 1 to 200",
        "empty tz": "'tz' must be an IANA zone name such as 'Europe/Paris', or None",
    }
    for case, value in cases.items():
        (only,) = errors_of(value)
        assert only[0] == "django_debounce.E047", case
        assert wanted[case] in only[2], (case, only[2])


@pytest.mark.django_db
def test_an_entry_that_does_not_fit_its_task_is_e048_and_does_not_run(clock, declare, caplog):
    declare("set.fit")
    declare("set.keyed", debounce="1m", debounce_max_wait="5m", debounce_key="k:{user.pk}")
    declare("set.coded", schedule=Schedule("0 * * * *", name="taken-name"))
    value = {
        "bad-cron": {"task": "set.fit", "cron": "0 25 * * *"},
        "bad-zone": {"task": "set.fit", "cron": "0 3 * * *", "tz": "Mars/Olympus"},
        "bad-args": {"task": "set.fit", "cron": "0 3 * * *", "args": [1, 2, 3]},
        "bad-key": {"task": "set.keyed", "cron": "0 3 * * *", "kwargs": {"user": "ann"}},
        "near-miss": {"task": "set.fitt", "cron": "0 3 * * *"},
        "taken-name": {"task": "set.fit", "cron": "0 3 * * *"},
        "fine": {"task": "set.fit", "cron": "*/5 * * * *", "tz": "UTC", "args": ["ok"]},
    }
    found = {obj: msg for _id, obj, msg in errors_of(value)}
    assert set(found) == {
        "DEBOUNCE_SCHEDULES['bad-cron']",
        "DEBOUNCE_SCHEDULES['bad-zone']",
        "DEBOUNCE_SCHEDULES['bad-args']",
        "DEBOUNCE_SCHEDULES['bad-key']",
        "DEBOUNCE_SCHEDULES['near-miss']",
        "DEBOUNCE_SCHEDULES['taken-name']",
    }
    assert "is not a cron expression" in found["DEBOUNCE_SCHEDULES['bad-cron']"]
    assert "unknown time zone 'Mars/Olympus'" in found["DEBOUNCE_SCHEDULES['bad-zone']"]
    assert "do not fit the task's signature" in found["DEBOUNCE_SCHEDULES['bad-args']"]
    assert (
        "cannot resolve the task's debounce_key 'k:{user.pk}'"
        in (found["DEBOUNCE_SCHEDULES['bad-key']"])
    )
    assert "Did you mean 'set.fit'?" in found["DEBOUNCE_SCHEDULES['near-miss']"]
    assert (
        "already a schedule of task 'set.coded', declared in code"
        in (found["DEBOUNCE_SCHEDULES['taken-name']"])
    )
    with override_settings(DEBOUNCE_SCHEDULES=value):
        with pytest.raises(SystemCheckError, match="E048"):
            call_command("run_debounce_worker", burst=True, skip_checks=False)
        # A process that skipped the checks runs the good entry, logs each bad one once.
        clock(at=T + MINUTE)
        with caplog.at_level(logging.ERROR, logger="django_debounce.periodic"):
            first = PeriodicScheduler().defer_due()
            PeriodicScheduler().defer_due()
        assert {k: v for k, v in first.items() if k != "taken-name"} == {"fine": "created"}
    logged = [r for r in caplog.records if getattr(r, "action", "") == "periodic_settings_error"]
    assert sorted(r.schedule for r in logged) == [
        "bad-args",
        "bad-cron",
        "bad-key",
        "bad-zone",
        "near-miss",
        "taken-name",
    ]
    assert list(Job.objects.filter(task_name="set.fit").values_list("args", flat=True)) == [["ok"]]


@pytest.mark.django_db
def test_a_setting_of_the_wrong_shape_runs_no_schedule_and_logs_once(clock, declare, caplog):
    declare("set.shape", schedule=Schedule("*/5 * * * *", tz="UTC", name="code-five"))
    clock(at=T + MINUTE)
    with override_settings(DEBOUNCE_SCHEDULES={"a": "* * * * *"}):
        with caplog.at_level(logging.ERROR, logger="django_debounce.periodic"):
            assert PeriodicScheduler().defer_due() == {"code-five": "created"}
            assert [p.name for p in registered_schedules() if p.name == "code-five"] == [
                "code-five"
            ]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "DEBOUNCE_SCHEDULES['a']='* * * * *' must be a dict such as "
        '{"task": "app.tasks.fn", "cron": "*/5 * * * *"}.'
    ]


@pytest.mark.django_db
def test_every_wrong_entry_is_named_at_once():
    value = {
        "a": {"task": "t", "cron": "* * * * *", "queue": "x"},
        "b": {"task": "t", "cron": "* * * * *"},
        "c": {"cron": "* * * * *"},
    }
    ((check_id, _obj, message),) = errors_of(value)
    assert check_id == "django_debounce.E047"
    assert message == (
        "DEBOUNCE_SCHEDULES['a']: unknown key(s) ['queue']; accepted: task, cron, tz, args, "
        "kwargs, overlap, pass_tick, max_lateness. DEBOUNCE_SCHEDULES['c']: 'task' is "
        "required and must be a non-empty str (the task's registered name, e.g. "
        "'reports.tasks.build_report')."
    )
