"""Django's ``@task(schedule=...)`` on DebounceBackend is a periodic task too (decision 177)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_debounce import registry
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job, PeriodicTick
from django_debounce.ops.periodic import PeriodicScheduler
from tests.conftest import T
from tests.testapp.models import CallLog

try:
    from django.tasks import task as django_task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task as django_task  # type: ignore[no-redef]


def hourly_report(kind: str) -> None:
    """A module-level function (Django's rule); decorated by the test, not at import."""
    CallLog.objects.create(task="per.django", key=kind)


def two_args(a: int, b: int) -> None: ...


@pytest.fixture
def names():
    taken: list[str] = []
    yield taken
    for name in taken:
        registry.unregister(name)


@pytest.mark.django_db
def test_a_django_task_with_a_schedule_defers_its_ticks(clock, burst, names):
    names.append(f"{__name__}.hourly_report")
    from django_debounce import Schedule

    django_task(schedule=Schedule("0 * * * *", tz="UTC", args=("hourly",)))(hourly_report)
    clock(at=T + dt.timedelta(minutes=2))
    assert PeriodicScheduler().defer_due() == {f"{__name__}.hourly_report": "created"}
    burst()
    (job,) = Job.objects.filter(task_name=f"{__name__}.hourly_report")
    assert job.status == Job.Status.SUCCESSFUL
    assert list(CallLog.objects.filter(task="per.django").values_list("key", flat=True)) == [
        "hourly"
    ]
    assert PeriodicTick.objects.get().job_id == job.pk


@pytest.mark.django_db
def test_a_django_tasks_schedule_is_checked_against_its_function(names):
    names.append(f"{__name__}.two_args")
    with pytest.raises(ConfigurationError, match=r"args/kwargs do not fit the task's signature"):
        django_task(schedule="* * * * *")(two_args)
