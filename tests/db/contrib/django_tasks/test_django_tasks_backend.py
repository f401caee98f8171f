"""``DebounceBackend``: Django's ``@task`` as debounce jobs (issue #10 item 4, decisions 95-99).

``TASKS["default"]`` is the backend (tests/settings.py); the tasks are in
tests/testapp/tasks_django.py. Runs go through the real worker command
(``run_debounce_worker --burst``, in this process).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import override_settings

from django_debounce import debounced_task, registry
from django_debounce import task as debounce_task
from django_debounce.contrib.django_tasks.backend import TASK_FIELDS, DebounceBackend, DebounceTask
from django_debounce.contrib.django_tasks.checks import check_task_backends
from django_debounce.contrib.django_tasks.results import (
    FRAMEWORK,
    DjangoTaskEntry,
    InvalidTask,
    JobCancelledError,
    JobExpiredError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_debounce.exceptions import ConfigurationError, KeyResolutionError, PayloadError
from django_debounce.lifecycle import cancel_ready, expire
from django_debounce.models import DeadLetter, Job
from django_debounce.options import TASK_OPTIONS
from tests.conftest import T
from tests.testapp.models import CallLog
from tests.testapp.tasks_django import (
    add,
    always_fails,
    async_add,
    expiring,
    on_django_queue,
    report,
    report_latest,
    report_leading,
    task,
    with_context,
)

pytestmark = pytest.mark.django_db


def job_of(result: TaskResult) -> Job:
    return Job.objects.get(pk=int(result.id))


# -- declaration and registration ------------------------------------------------------


def test_the_framework_is_djangos_own_on_6x_and_the_backport_on_5_2():
    import django

    assert FRAMEWORK == ("django.tasks" if django.VERSION >= (6, 0) else "django_tasks")
    assert isinstance(task_backends["default"], DebounceBackend)


def test_a_django_task_is_registered_under_its_module_path_at_declaration():
    entry = registry.lookup("tests.testapp.tasks_django.report")
    assert isinstance(entry, DjangoTaskEntry)
    assert entry.task.func is report.func
    assert isinstance(report, DebounceTask)
    assert entry.options.debounce == timedelta(seconds=10)
    assert entry.options.debounce_max_wait == timedelta(seconds=60)
    assert entry.options.debounce_key == "report:{user_id}"


def test_using_keeps_the_declared_entry():
    entry = registry.lookup("tests.testapp.tasks_django.add")
    variant = add.using(priority=5)
    assert variant.priority == 5
    assert registry.lookup("tests.testapp.tasks_django.add") is entry


def test_the_task_class_carries_every_task_option_django_does_not_name_itself():
    # A new option of @task (django_debounce) must be added to DebounceTask too.
    assert set(TASK_FIELDS) == TASK_OPTIONS - {"queue", "priority", "takes_context"}


def test_capability_flags():
    backend = task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True


# Module-level functions for declaration errors (Django requires module-level task functions).
def undeclared_a(user_id: int) -> None: ...


def undeclared_b(user_id: int) -> None: ...


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"debounce": "10s"}, "debounce_max_wait"),
        ({"debounce": "10s", "debounce_max_wait": "5s"}, "shorter"),
        ({"debounce": "-1s", "debounce_max_wait": "5s"}, ""),
        ({"debounce": "10s", "debounce_max_wait": "1m", "unique_key": "x"}, "unique_key"),
        ({"debounce_key": "k:{0}"}, "debounce="),
        ({"on_excess": "explode"}, "on_excess"),
        ({"rate_limit": "fast"}, ""),
        ({"executor": "rabbit"}, "not an executor"),
    ],
)
def test_task_options_get_the_same_errors_as_debounced_task(options, message):
    with pytest.raises(ConfigurationError) as ours:
        debounce_task(name="tests.dj.undeclared", **options)(undeclared_a)
    with pytest.raises(ConfigurationError) as djangos:
        task(**options)(undeclared_b)
    assert message in str(djangos.value)
    # The same message, naming each its own task.
    assert str(djangos.value).replace(
        "tests.db.contrib.django_tasks.test_django_tasks_backend.undeclared_b",
        "tests.dj.undeclared",
    ) == str(ours.value)
    assert (
        registry.lookup("tests.db.contrib.django_tasks.test_django_tasks_backend.undeclared_b")
        is None
    )


def test_a_django_task_can_name_its_executor():
    declared = task(executor="celery")(undeclared_b)
    try:
        assert registry.lookup(declared.module_path).options.executor == "celery"
    finally:
        registry.unregister(declared.module_path)


def test_a_debounce_without_max_wait_uses_the_setting_as_debounced_task_does(settings):
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "2m"
    declared = task(debounce="10s")(undeclared_b)
    try:
        entry = registry.lookup(declared.module_path)
        assert entry.options.debounce_max_wait == timedelta(minutes=2)
        reference = debounced_task(name="tests.dj.ref", debounce="10s")(undeclared_a)
        assert reference.options.debounce_max_wait == entry.options.debounce_max_wait
    finally:
        registry.unregister(declared.module_path)
        registry.unregister("tests.dj.ref")


def test_an_unknown_option_is_a_configuration_error_naming_the_likely_one():
    with pytest.raises(ConfigurationError) as error:
        task(debounce="1s", debounce_maxwait="1m")(undeclared_b)
    assert "unknown option(s) ['debounce_maxwait']" in str(error.value)
    assert "did you mean 'debounce_max_wait'?" in str(error.value)
    assert (
        registry.lookup("tests.db.contrib.django_tasks.test_django_tasks_backend.undeclared_b")
        is None
    )


def test_a_shed_job_is_a_failed_result_with_the_shed_reason(clock):
    from django_debounce.contrib.django_tasks.results import JobShedError
    from django_debounce.lifecycle import shed

    result = expiring.enqueue("s")
    with transaction.atomic():
        shed(job_of(result), reason="shed: rate 1/s exceeded", metadata={"shed": True}, now=T)
    fresh = expiring.get_result(result.id)
    assert fresh.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in fresh.errors] == [JobShedError]
    assert fresh.errors[0].traceback == "shed: rate 1/s exceeded"


def test_djangos_own_rules_still_apply():
    with pytest.raises(InvalidTask, match="Queue 'nowhere'"):
        task(queue_name="nowhere")(undeclared_b)
    with pytest.raises(InvalidTask, match="priority"):
        task(priority=101)(undeclared_b)


# -- enqueue -----------------------------------------------------------------------------


def test_enqueue_writes_one_job_and_returns_a_ready_result(clock):
    result = add.enqueue(2, 3)
    assert isinstance(result, TaskResult)
    assert result.status == TaskResultStatus.READY
    assert result.task is add
    assert result.backend == "default"
    assert (result.args, result.kwargs) == ([2, 3], {})
    assert result.enqueued_at == T
    assert (result.started_at, result.finished_at, result.worker_ids, result.errors) == (
        None,
        None,
        [],
        [],
    )
    job = job_of(result)
    assert (job.task_name, job.queue, job.priority, job.status) == (
        "tests.testapp.tasks_django.add",
        "default",
        0,
        "READY",
    )
    assert job.run_at == T
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_queue_and_priority_come_from_the_task_and_using(clock):
    job = job_of(on_django_queue.enqueue("q"))
    assert (job.queue, job.priority) == ("django", 10)
    job = job_of(on_django_queue.using(priority=-5, queue_name="default").enqueue("q"))
    assert (job.queue, job.priority) == ("default", -5)


def test_run_after_is_the_jobs_eta_and_a_debounced_task_refuses_it(clock):
    job = job_of(add.using(run_after=T + timedelta(minutes=5)).enqueue(1, 1))
    assert job.run_at == T + timedelta(minutes=5)
    with pytest.raises(ConfigurationError, match="countdown/eta on a debounced call"):
        report.using(run_after=T + timedelta(minutes=5)).enqueue(user_id=1)
    assert Job.objects.filter(task_name__endswith=".report").count() == 0


def test_a_burst_collapses_into_one_job_run_once_with_the_first_payload(clock, burst):
    ids = []
    for second, revision in ((0, 1), (3, 2), (7, 3)):
        clock(seconds=second)
        ids.append(report.enqueue(user_id=7, revision=revision).id)
    assert len(set(ids)) == 1
    job = Job.objects.get(pk=int(ids[0]))
    assert (job.enqueue_count, job.run_at, job.max_run_at) == (
        3,
        T + timedelta(seconds=17),
        T + timedelta(seconds=60),
    )
    clock(seconds=16.9)
    burst()
    assert CallLog.objects.filter(task="dj.report").count() == 0
    clock(seconds=17)
    burst()
    assert list(CallLog.objects.filter(task="dj.report").values_list("payload", flat=True)) == [
        {"revision": 1}
    ]
    result = report.get_result(ids[0])
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"user_id": 7, "revision": 1}


def test_replace_payload_runs_the_newest_call(clock, burst):
    for second, revision in ((0, 1), (3, 2), (7, 3)):
        clock(seconds=second)
        result = report_latest.enqueue(5, revision=revision)
    assert result.kwargs == {"revision": 3}
    clock(seconds=17)
    burst()
    assert report_latest.get_result(result.id).return_value == 3


def test_a_leading_edge_runs_the_first_call_at_once_and_swallows_the_burst(clock, burst):
    first = report_leading.enqueue(5, revision=1)
    burst()
    assert report_leading.get_result(first.id).return_value == 1
    clock(seconds=3)
    again = report_leading.enqueue(5, revision=2)
    assert again.id == first.id  # swallowed: the leading job's result
    clock(seconds=13)
    later = report_leading.enqueue(5, revision=3)
    burst()
    assert later.id != first.id and report_leading.get_result(later.id).return_value == 3


def test_key_and_payload_errors_are_the_packages_and_nothing_is_written():
    with pytest.raises(KeyResolutionError):
        report.enqueue(user_id=None)
    with pytest.raises(PayloadError):
        add.enqueue({1, 2}, 3)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "value", [uuid.UUID(int=7), Decimal("1.5"), datetime(2026, 3, 1, tzinfo=UTC), b"\xff"]
)
def test_a_value_djangos_task_result_cannot_hold_is_refused_before_any_write(value):
    # Django's TaskResult keeps JSON arguments only; the codec's richer types (§5) are
    # @debounced_task's. Before the check the job was written, then TaskResult raised.
    with pytest.raises(PayloadError, match="JSON arguments only"):
        add.enqueue(value, 1)
    with pytest.raises(PayloadError, match="JSON arguments only"):
        report.enqueue(user_id=1, revision=value)
    assert Job.objects.count() == 0


def test_enqueue_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = add.enqueue(1, 2)
        assert Job.objects.filter(pk=int(result.id)).exists()
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0


# -- running and results ---------------------------------------------------------------


def test_a_run_under_the_worker_records_the_result(clock, burst):
    result = add.enqueue(2, 3)
    clock(seconds=1)
    burst(worker_id="w-1")
    fresh = add.get_result(result.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL
    assert fresh.return_value == 5
    assert (fresh.started_at, fresh.last_attempted_at, fresh.finished_at) == (
        T + timedelta(seconds=1),
        T + timedelta(seconds=1),
        T + timedelta(seconds=1),
    )
    assert fresh.worker_ids == ["w-1"]
    assert fresh.attempts == 1
    assert fresh.is_finished
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5


def test_a_failure_retries_then_fails_with_the_error(clock, burst):
    result = always_fails.enqueue("x")
    burst()
    first = always_fails.get_result(result.id)
    assert first.status == TaskResultStatus.READY  # a retry is scheduled
    assert [e.exception_class for e in first.errors] == [ValueError]
    assert "boom x" in first.errors[0].traceback
    clock(seconds=2)
    burst()
    final = always_fails.get_result(result.id)
    assert final.status == TaskResultStatus.FAILED
    assert final.attempts == 2
    assert final.errors[0].exception_class is ValueError
    with pytest.raises(ValueError, match="Task failed"):
        _ = final.return_value
    assert DeadLetter.objects.filter(job_id=int(result.id)).count() == 1


def test_takes_context_receives_djangos_task_context(clock, burst):
    result = with_context.enqueue("c")
    burst()
    assert with_context.get_result(result.id).return_value == {
        "attempt": 1,
        "id": result.id,
        "status": "RUNNING",
        "context": "TaskContext",
    }


def test_an_async_task_runs(clock, burst):
    result = async_add.enqueue(20, 22)
    burst()
    assert async_add.get_result(result.id).return_value == 42


@pytest.mark.parametrize(
    ("end", "error"), [(expire, JobExpiredError), (cancel_ready, JobCancelledError)]
)
def test_jobs_that_never_ran_are_failed_results_naming_why(clock, end, error):
    result = expiring.enqueue("e")
    end([int(result.id)], now=T)
    fresh = expiring.get_result(result.id)
    assert fresh.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in fresh.errors] == [error]
    assert fresh.finished_at == T


def test_get_result_of_what_is_not_a_django_tasks_job():
    backend = task_backends["default"]
    for bad in ("nope", "0", str(2**70)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)
    from tests.testapp.tasks_common import noop

    job = noop.delay()
    with pytest.raises(TaskResultDoesNotExist, match="not a Django @task"):
        backend.get_result(str(job.pk))


def test_signals_are_sent_with_task_results(clock, burst):
    seen = []

    def receiver(sender, task_result, signal, **kwargs):
        seen.append((signal, sender, task_result.id, task_result.status))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver)
    try:
        result = add.enqueue(1, 1)
        failing = always_fails.enqueue("s")
        burst()
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(receiver)
    names = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}
    assert sorted((names[s], i, str(st)) for s, _, i, st in seen) == sorted(
        [
            ("enqueued", result.id, "READY"),
            ("enqueued", failing.id, "READY"),
            ("started", result.id, "RUNNING"),
            ("started", failing.id, "RUNNING"),
            ("finished", result.id, "SUCCESSFUL"),
            ("finished", failing.id, "READY"),  # the retry is scheduled
        ]
    )
    assert {sender for _, sender, _, _ in seen} == {DebounceBackend}


# -- configuration errors ----------------------------------------------------------------


def _backend_with(**params):
    return DebounceBackend("debounce", {"BACKEND": "x", **params})


def test_unknown_options_are_e031_and_refused_at_enqueue():
    backend = _backend_with(OPTIONS={"debounce": "5s"})
    assert [m.id for m in backend.check()] == ["django_debounce.E031"]
    assert "@task(debounce=" in backend.check()[0].hint
    with pytest.raises(ConfigurationError, match="OPTIONS"):
        backend.enqueue(add, (1, 2), {})
    assert Job.objects.count() == 0


def test_bad_queue_names_are_e032():
    backend = _backend_with(QUEUES=["default", " padded", "x" * 101])
    assert [m.id for m in backend.check()] == ["django_debounce.E032"] * 2


def test_a_clean_backend_has_no_check_messages():
    assert task_backends["default"].check() == []


def test_a_mistyped_backend_path_is_e030():
    with override_settings(
        TASKS={"default": {"BACKEND": "django_debounce.backend.DebounceBackend"}}
    ):
        messages = check_task_backends()
    assert [m.id for m in messages] == ["django_debounce.E030"]
    assert "django_debounce.backends.DebounceBackend" in messages[0].hint


def test_no_tasks_framework_is_e034(monkeypatch):
    from django_debounce.contrib.django_tasks import checks as integration_checks

    monkeypatch.setattr(integration_checks, "_has_tasks_framework", lambda: False)
    messages = check_task_backends()
    assert [m.id for m in messages] == ["django_debounce.E034"]
    assert "django-debounce[tasks]" in messages[0].hint


def test_a_tasks_module_kept_from_importing_is_e033(monkeypatch):
    from django_debounce.contrib.django_tasks import checks as integration_checks

    monkeypatch.setattr(
        integration_checks, "TASK_MODULE_ERRORS", [("shop.tasks", "Could not find backend 'x'")]
    )
    messages = check_task_backends()
    assert [m.id for m in messages] == ["django_debounce.E033"]
    assert "shop.tasks" in messages[0].msg


def test_aenqueue_and_aget_result_work_from_async_code(clock, burst):
    from asgiref.sync import async_to_sync

    result = async_to_sync(add.aenqueue)(4, 5)
    assert job_of(result).args == [4, 5]
    burst()
    assert async_to_sync(add.aget_result)(result.id).return_value == 9
