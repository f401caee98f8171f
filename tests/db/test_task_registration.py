"""Declaring tasks (contract §2): registration-time errors, names, inline calls, enqueue by name."""

from __future__ import annotations

import asyncio
import inspect
from datetime import timedelta

import pytest

import django_debounce
from django_debounce import debounced_task, registry, task
from django_debounce.exceptions import ConfigurationError, UnknownTaskError
from django_debounce.models import Job
from tests.conftest import T


@pytest.fixture
def names():
    """Names the test registers; unregistered afterwards."""
    taken: list[str] = []
    yield taken
    for name in taken:
        registry.unregister(name)


def _assert_refused(names, name, **options):
    """Decorating under ``name`` with ``options`` raises ConfigurationError and registers nothing."""
    names.append(name)
    with pytest.raises(ConfigurationError) as info:

        @task(name=name, **options)
        def f(x):
            return x

    assert isinstance(info.value, ValueError)
    assert registry.lookup(name) is None
    return str(info.value)


def test_debounce_without_max_wait_and_no_default(names):
    message = _assert_refused(names, "enq.reg.no_max_wait", debounce="5m")
    assert "debounce_max_wait" in message and "DEBOUNCE_DEFAULT_MAX_WAIT" in message
    with pytest.raises(ConfigurationError, match="debounce_max_wait"):

        @debounced_task(name="enq.reg.no_max_wait2", debounce="5m")
        def g(x):
            return x

    assert registry.lookup("enq.reg.no_max_wait2") is None


@pytest.mark.django_db
def test_project_default_max_wait_is_used(settings, names, clock):
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "2m"
    names.append("enq.reg.default_max_wait")

    @debounced_task(name="enq.reg.default_max_wait", debounce="30s", debounce_key="k")
    def f(x):
        return x

    assert f.options.debounce_max_wait == timedelta(minutes=2)
    job = f.delay(1)
    assert (job.run_at, job.opened_at, job.max_run_at) == (
        T + timedelta(seconds=30),
        T,
        T + timedelta(minutes=2),
    )
    # The setting is still validated against the window.
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "10s"
    _assert_refused(names, "enq.reg.default_too_short", debounce="30s")


def test_debounced_task_needs_a_window(names):
    names.append("enq.reg.no_window")
    with pytest.raises(ConfigurationError, match="DEBOUNCE_DEFAULT_WINDOW"):

        @debounced_task(name="enq.reg.no_window", debounce_max_wait="1h")
        def f(x):
            return x

    assert registry.lookup("enq.reg.no_window") is None


@pytest.mark.django_db
def test_project_default_window_is_used(settings, names, clock):
    settings.DEBOUNCE_DEFAULT_WINDOW = "45s"
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "10m"
    names.append("enq.reg.default_window")

    @debounced_task(name="enq.reg.default_window")
    def f(x):
        return x

    assert f.options.debounce == timedelta(seconds=45)
    job = f.delay(1)
    assert (job.run_at, job.max_run_at) == (T + timedelta(seconds=45), T + timedelta(minutes=10))


@pytest.mark.django_db
def test_bare_debounced_task_takes_both_durations_from_the_settings(settings, names, clock):
    """``@debounced_task`` without brackets, as ``@task`` works bare (a new user's trial)."""
    settings.DEBOUNCE_DEFAULT_WINDOW = "45s"
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "10m"

    @debounced_task
    def bare_rebuild(x):
        return x

    names.append(bare_rebuild.name)
    assert bare_rebuild.name == f"{__name__}.{bare_rebuild.__qualname__}"
    assert registry.get_task(bare_rebuild.name) is bare_rebuild
    assert bare_rebuild(3) == 3
    job = bare_rebuild.delay(1)
    assert (job.run_at, job.max_run_at) == (T + timedelta(seconds=45), T + timedelta(minutes=10))
    assert bare_rebuild.delay(1).outcome == "debounced"
    assert Job.objects.count() == 1


def test_bare_debounced_task_without_a_default_window_names_the_setting(names):
    with pytest.raises(ConfigurationError, match="DEBOUNCE_DEFAULT_WINDOW"):

        @debounced_task
        def no_window(x):
            return x

    assert not [name for name in registry.all_tasks() if name.endswith(".no_window")]


def test_max_wait_shorter_than_window(names):
    message = _assert_refused(names, "enq.reg.short", debounce="5m", debounce_max_wait="4m")
    assert "shorter than the window" in message
    # Equal is fine: the window is also the ceiling.
    names.append("enq.reg.equal")

    @task(name="enq.reg.equal", debounce="5m", debounce_max_wait="5m")
    def f(x):
        return x

    assert registry.get_task("enq.reg.equal") is f


@pytest.mark.parametrize("bad", ["0s", "-1m", "5 minutes", 0, -1, "", "1x"])
@pytest.mark.parametrize("option", ["debounce", "debounce_max_wait", "expires", "max_backoff"])
def test_bad_durations(names, option, bad):
    options = {"debounce": "10s", "debounce_max_wait": "1h", option: bad}
    assert option in _assert_refused(names, f"enq.reg.dur.{option}", **options)


def test_unparseable_rate(names):
    assert "'ten/m'" in _assert_refused(names, "enq.reg.rate", rate_limit="ten/m")


def test_unknown_on_excess(names):
    message = _assert_refused(names, "enq.reg.excess", on_excess="queue")
    assert "'queue'" in message and "defer" in message and "drop" in message


@pytest.mark.parametrize("priority", [101, -101, "high", 1.5, True])
def test_priority_out_of_range(names, priority):
    assert "-100 to 100" in _assert_refused(names, "enq.reg.prio", priority=priority)


@pytest.mark.parametrize("priority", [-100, 0, 100])
def test_priority_bounds_are_accepted(names, priority):
    names.append("enq.reg.prio_ok")

    @task(name="enq.reg.prio_ok", priority=priority)
    def f(x):
        return x

    assert f.options.priority == priority


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"unique_key": "u:{0}"}, id="unique_key"),
        pytest.param({"unique_key": lambda x: str(x)}, id="unique_key-callable"),
        pytest.param({"idempotent": True}, id="idempotent"),
    ],
)
def test_debounce_with_coalescing_is_refused(names, options):
    message = _assert_refused(
        names, "enq.reg.both", debounce="10s", debounce_max_wait="1m", **options
    )
    assert "§1" in message


def test_merge_and_replace_are_refused(names):
    message = _assert_refused(
        names,
        "enq.reg.merge_replace",
        debounce="10s",
        debounce_max_wait="1m",
        debounce_merge=lambda stored, new: stored,
        debounce_replace_payload=True,
    )
    assert "debounce_merge" in message and "debounce_replace_payload" in message


def test_other_option_errors(names):
    # Project decisions: each of these fails at decoration too.
    _assert_refused(names, "enq.reg.key_only", debounce_key="k:{0}")  # no window
    _assert_refused(names, "enq.reg.max_only", debounce_max_wait="1m")  # no window
    _assert_refused(names, "enq.reg.retries", max_retries=-1)
    _assert_refused(names, "enq.reg.queue", queue="")
    _assert_refused(names, "enq.reg.unique_and_idem", unique_key="u", idempotent=True)
    _assert_refused(names, "enq.reg.expires", debounce="10s", debounce_max_wait="1h", expires="30m")


def test_unknown_decorator_option_fails_at_decoration(names):
    names.append("enq.reg.typo")
    with pytest.raises((TypeError, ValueError), match="debounce_wait"):

        @task(name="enq.reg.typo", debounce_wait="5m")
        def f(x):
            return x

    assert registry.lookup("enq.reg.typo") is None


def test_a_misspelled_decorator_option_names_the_likely_one(names):
    names.append("enq.reg.typo_window")
    with pytest.raises(ConfigurationError) as info:

        @debounced_task(name="enq.reg.typo_window", debounce="5m", debounce_maxwait="1h")
        def f(x):
            return x

    message = str(info.value)
    assert message.startswith(
        "task 'enq.reg.typo_window': unknown option(s) ['debounce_maxwait'] "
        "(did you mean 'debounce_max_wait'?); accepted: "
    ), message
    assert registry.lookup("enq.reg.typo_window") is None
    several = _assert_refused(names, "enq.reg.typos", priorty=1, quene="q", zzz=1)
    assert "unknown option(s) ['priorty', 'quene', 'zzz'] (did you mean 'priority' for " in several
    assert "'queue' for 'quene'?); accepted: " in several
    nothing_close = _assert_refused(names, "enq.reg.far", zzz=1)
    assert "unknown option(s) ['zzz']; accepted: " in nothing_close


def test_a_misspelled_call_option_names_the_likely_one(names):
    names.append("enq.reg.call_typo")

    @task(name="enq.reg.call_typo")
    def f(x):
        return x

    expected = r"\['countdwn'\] for task 'enq.reg.call_typo' \(did you mean 'countdown'\?\); "
    with pytest.raises(ConfigurationError, match=expected):
        f.apply_async((1,), countdwn=5)


def test_a_taken_name_refuses_a_different_function(names):
    names.append("enq.reg.taken")

    @task(name="enq.reg.taken")
    def first(x):
        return 1

    with pytest.raises(ConfigurationError, match="already taken") as info:

        @task(name="enq.reg.taken")
        def second(x):
            return 2

    assert isinstance(info.value, ValueError)
    assert registry.get_task("enq.reg.taken") is first


def _same(x):
    return x


def test_the_same_function_may_register_again(names):
    names.append("enq.reg.same")
    one = task(name="enq.reg.same")(_same)
    two = task(name="enq.reg.same", queue="other")(_same)
    assert registry.get_task("enq.reg.same") is two
    assert one.func is two.func is _same


@task
def module_level(x):
    return x * 2


@debounced_task(debounce="1s", debounce_max_wait="2s")
async def module_level_async(x):
    return x * 3


def test_name_defaults_to_module_and_qualname(names):
    assert module_level.name == "tests.db.test_task_registration.module_level"
    assert module_level_async.name == "tests.db.test_task_registration.module_level_async"
    assert registry.get_task("tests.db.test_task_registration.module_level") is module_level

    class Holder:
        @staticmethod
        def method(x):
            return x

    nested = task(Holder.method)
    names.append(nested.name)
    assert nested.name == (
        "tests.db.test_task_registration.test_name_defaults_to_module_and_qualname.<locals>.Holder.method"
    )

    @task(name="enq.reg.explicit")
    def renamed(x):
        return x

    names.append("enq.reg.explicit")
    assert renamed.name == "enq.reg.explicit"
    assert registry.get_task("enq.reg.explicit") is renamed


@pytest.mark.django_db
def test_calling_the_task_runs_inline():
    assert module_level(21) == 42
    coroutine = module_level_async(5)
    assert inspect.iscoroutine(coroutine)
    assert asyncio.run(coroutine) == 15
    assert Job.objects.count() == 0
    # The decorated object still looks like the function.
    assert module_level.__name__ == "module_level"
    assert module_level.__wrapped__(1) == 2


@pytest.mark.django_db
def test_enqueue_by_name_uses_the_task_defaults(names, clock, burst):
    seen = []
    names.append("enq.reg.by_name")

    @debounced_task(
        name="enq.reg.by_name",
        debounce="10s",
        debounce_max_wait="1m",
        debounce_key="n:{user_id}",
        queue="mail",
        priority=7,
        max_retries=1,
        metadata={"team": "a"},
    )
    def by_name(user_id, note=""):
        seen.append((user_id, note))

    first = django_debounce.enqueue("enq.reg.by_name", args=(5,))
    second = django_debounce.enqueue("enq.reg.by_name", kwargs={"user_id": 5, "note": "x"})
    assert (first.outcome, second.outcome) == ("created", "debounced")
    assert second.pk == first.pk
    row = Job.objects.get(pk=first.pk)
    assert (row.queue, row.priority, row.max_retries, row.metadata) == ("mail", 7, 1, {"team": "a"})
    assert (row.debounce_key, row.run_at, row.max_run_at) == (
        "n:5",
        T + timedelta(seconds=10),
        T + timedelta(minutes=1),
    )
    clock(seconds=10)
    burst()
    assert seen == [(5, "")]


@pytest.mark.django_db
def test_enqueue_of_an_unknown_name_inserts_a_plain_job(clock):
    # A producer that never imported the task enqueues by name (§2); only its own
    # options apply. The worker dead-letters a name nobody registered (§7).
    job = django_debounce.enqueue("enq.reg.nowhere", args=(1,), kwargs={"a": 2})
    row = Job.objects.get(pk=job.pk)
    assert (row.task_name, row.args, row.kwargs, row.run_at) == (
        "enq.reg.nowhere",
        [1],
        {"a": 2},
        T,
    )
    with pytest.raises(UnknownTaskError):
        registry.get_task("enq.reg.nowhere")


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", None, 5])
def test_enqueue_needs_a_task_name(name):
    with pytest.raises(ConfigurationError):
        django_debounce.enqueue(name)
    assert Job.objects.count() == 0
