"""A key's window from code (issue #21 item 1): ``Task.window()``, inspect, flush, cancel.

Window 10 s, max wait 60 s, calls at T+0, T+3 and T+7 unless a test says
otherwise; the clock never ticks on its own (§4.7).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import OperationalError, transaction
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import (
    ConfigurationError,
    KeyResolutionError,
    WindowContentionError,
)
from django_debounce.models import Job
from django_debounce.ops import window_handles
from django_debounce.ops.window_handles import Window, Windows
from tests.conftest import T

pytestmark = pytest.mark.django_db

#: (task, args, kwargs, now) of every run, in order (runs are inline under ``--burst``).
RUNS: list[tuple[str, tuple, dict, datetime]] = []

WINDOW = {"debounce": "10s", "debounce_max_wait": "60s"}


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    yield
    RUNS.clear()


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def row(job: Job) -> dict:
    job = Job.objects.get(pk=job.pk)
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@debounced_task(name="win.first", debounce_key="u:{user_id}", **WINDOW)
def first(user_id, revision=0):
    RUNS.append(("win.first", (user_id,), {"revision": revision}, timezone.now()))


@debounced_task(
    name="win.last", debounce_key="u:{user_id}", debounce_replace_payload=True, **WINDOW
)
def last(user_id, revision=0):
    RUNS.append(("win.last", (user_id,), {"revision": revision}, timezone.now()))


def _max_revision(stored, new):
    (args, kwargs), (_, new_kwargs) = stored, new
    return args, {"revision": max(kwargs.get("revision", 0), new_kwargs.get("revision", 0))}


@debounced_task(
    name="win.merged", debounce_key="u:{user_id}", debounce_merge=_max_revision, **WINDOW
)
def merged(user_id, revision=0):
    RUNS.append(("win.merged", (user_id,), {"revision": revision}, timezone.now()))


@debounced_task(name="win.by_callable", debounce_key=lambda user, **kw: f"c:{user['id']}", **WINDOW)
def by_callable(user, revision=0):
    RUNS.append(("win.by_callable", (user,), {"revision": revision}, timezone.now()))


@debounced_task(
    name="win.optional",
    debounce_key=lambda user_id, **kw: None if user_id < 0 else f"o:{user_id}",
    **WINDOW,
)
def optional(user_id):
    pass


@debounced_task(name="win.default_key", **WINDOW)
def default_key(a, b=2):
    pass


@debounced_task(name="win.flaky", debounce_key="f:{0}", max_retries=2, **WINDOW)
def flaky(user_id):
    raise RuntimeError("down")


@task(name="win.plain")
def plain(*args, **kwargs):
    RUNS.append(("win.plain", args, kwargs, timezone.now()))


def three_calls(t, clock, user_id=1):
    """Calls at T+0 (revision 1), T+3 (revision 3) and T+7 (revision 2); return the job."""
    job = t.delay(user_id, revision=1)
    for at, revision in ((3, 3), (7, 2)):
        clock(seconds=at)
        assert t.delay(user_id, revision=revision).pk == job.pk
    return job


# -- inspect ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "revision"),
    [(first, 1), (last, 2), (merged, 3)],
    ids=["first payload", "replace payload", "merged payload"],
)
def test_inspect_after_three_calls_shows_the_window_exactly(t, revision, clock):
    job = three_calls(t, clock)
    handle = t.window(1)
    state = handle.inspect()
    assert handle == Window(t.name, "u:1")
    assert handle.pending() is True
    assert state is not None
    assert (state.task_name, state.key, state.job_id, state.status) == (
        t.name,
        "u:1",
        job.pk,
        "READY",
    )
    assert (state.open, state.running, state.run_in_flight) == (True, False, None)
    assert (state.opened_at, state.last_call_at, state.deadline, state.ceiling) == (
        T,
        s(7),
        s(17),
        s(60),
    )
    assert (state.calls, state.calls_collapsed) == (3, 2)
    assert state.payload == ((1,), {"revision": revision})
    assert (state.args, state.kwargs) == ((1,), {"revision": revision})


def test_nothing_open_inspects_as_none_and_flush_and_cancel_say_so(clock):
    handle = first.window(1)
    assert handle.inspect() is None
    assert handle.pending() is False
    for action in (handle.flush(), handle.cancel()):
        assert (action.done, action.reason, action.window, action.cancelled_dependents) == (
            False,
            "no_window",
            None,
            (),
        )
    assert Job.objects.count() == 0


def test_inspect_reads_one_query(django_assert_num_queries, clock):
    three_calls(first, clock)
    handle = first.window(1)
    with django_assert_num_queries(1):
        handle.inspect()
    with django_assert_num_queries(1):
        handle.pending()


# -- flush --------------------------------------------------------------------------------


def test_flush_makes_the_window_due_now_keeps_the_ceiling_and_it_runs_once(burst, clock):
    job = three_calls(last, clock)
    clock(seconds=8)
    action = last.window(1).flush()
    assert (action.done, action.reason) == (True, "flushed")
    assert action.window is not None
    assert (action.window.job_id, action.window.deadline, action.window.ceiling) == (
        job.pk,
        s(8),
        s(60),
    )
    assert action.window.open is True  # open until a worker claims it (§4.1)
    assert (row(job)["run_at"], row(job)["max_run_at"]) == (s(8), s(60))
    burst()
    assert RUNS == [("win.last", (1,), {"revision": 2}, s(8))]
    assert row(job)["status"] == Job.Status.SUCCESSFUL
    assert last.window(1).inspect() is None
    burst()
    assert len(RUNS) == 1


def test_flush_never_moves_a_due_window_later(clock):
    job = three_calls(first, clock)
    clock(seconds=30)  # due since T+17, not claimed: still open
    action = first.window(1).flush()
    assert action.done and action.window is not None
    assert action.window.deadline == s(17)
    assert row(job)["run_at"] == s(17)


def test_a_call_after_flush_still_joins_and_slides_the_window(clock):
    job = three_calls(first, clock)
    clock(seconds=8)
    first.window(1).flush()
    clock(seconds=9)
    assert first.delay(1, revision=9).pk == job.pk
    state = first.window(1).inspect()
    assert state is not None and (state.deadline, state.calls) == (s(19), 4)


# -- cancel -------------------------------------------------------------------------------


def test_cancel_ends_the_window_and_its_dependents_and_returns_what_was_cancelled(burst, clock):
    job = three_calls(last, clock)
    dependent = plain.apply_async(("after",), depends_on=[job])
    grandchild = plain.apply_async(("after after",), depends_on=[dependent])
    clock(seconds=8)
    action = last.window(1).cancel()
    assert (action.done, action.reason) == (True, "cancelled")
    assert action.cancelled_dependents == (dependent.pk, grandchild.pk)
    state = action.window
    assert state is not None
    assert (state.job_id, state.status, state.open, state.running) == (
        job.pk,
        "CANCELLED",
        False,
        False,
    )
    assert (state.calls, state.calls_collapsed, state.payload) == (3, 2, ((1,), {"revision": 2}))
    assert (state.opened_at, state.last_call_at, state.deadline) == (T, s(7), s(17))
    for pk in (job.pk, dependent.pk, grandchild.pk):
        assert Job.objects.get(pk=pk).status == Job.Status.CANCELLED
    assert Job.objects.get(pk=job.pk).window_key is None
    assert last.window(1).inspect() is None

    # The key's next call opens a new window; the cancelled one never runs.
    clock(seconds=9)
    again = last.delay(1, revision=5)
    assert (again.outcome, again.pk != job.pk) == ("created", True)
    state = last.window(1).inspect()
    assert state is not None and (state.job_id, state.opened_at, state.calls) == (again.pk, s(9), 1)
    clock(seconds=19)
    burst()
    assert RUNS == [("win.last", (1,), {"revision": 5}, s(19))]
    assert last.window(1).cancel().reason == "no_window"


# -- a claimed job ------------------------------------------------------------------------


def test_a_claimed_job_inspects_as_running_and_flush_and_cancel_leave_it(clock):
    job = three_calls(first, clock)
    clock(seconds=17)
    [claimed] = claim_jobs(worker_id="win-w1", limit=10, lease=timedelta(seconds=60))
    assert claimed.pk == job.pk
    before = row(job)
    handle = first.window(1)
    state = handle.inspect()
    assert state is not None
    assert (state.job_id, state.status, state.open, state.running, state.run_in_flight) == (
        job.pk,
        "RUNNING",
        False,
        True,
        job.pk,
    )
    assert (state.calls_collapsed, state.payload) == (2, ((1,), {"revision": 1}))
    assert handle.pending() is False
    for action in (handle.flush(), handle.cancel()):
        assert (action.done, action.reason, action.cancelled_dependents) == (False, "claimed", ())
        assert action.window is not None and action.window.running
        assert action.window.job_id == job.pk
    assert row(job) == before

    # A call now opens a window behind the run (§4.5): that is what the handle shows.
    clock(seconds=18)
    fresh = first.delay(1, revision=4)
    state = handle.inspect()
    assert state is not None
    assert (state.job_id, state.open, state.running, state.run_in_flight) == (
        fresh.pk,
        True,
        False,
        job.pk,
    )
    assert (state.deadline, state.calls) == (s(28), 1)
    action = handle.cancel()
    assert action.done and action.window is not None and action.window.run_in_flight == job.pk
    assert row(job) == before


def test_a_window_claimed_then_waiting_for_a_retry_is_reported_not_touched(burst, clock):
    job = flaky.delay(5)
    clock(seconds=10)
    burst()  # the run fails; the job is READY again after its backoff, no longer a window
    before = row(job)
    assert (before["status"], before["window_key"], before["attempts"]) == ("READY", None, 1)
    handle = flaky.window(5)
    state = handle.inspect()
    assert state is not None
    assert (state.job_id, state.status, state.open, state.running) == (
        job.pk,
        "READY",
        False,
        False,
    )
    assert handle.pending() is False
    assert [handle.flush().reason, handle.cancel().reason] == ["claimed", "claimed"]
    assert row(job) == before


# -- transactions -------------------------------------------------------------------------


class RollbackError(Exception):
    pass


def test_flush_and_cancel_inside_a_rolled_back_transaction_change_nothing(clock):
    job = three_calls(first, clock)
    dependent = plain.apply_async(("after",), depends_on=[job])
    before, dependent_before = row(job), row(dependent)
    clock(seconds=8)
    with pytest.raises(RollbackError), transaction.atomic():
        assert first.window(1).flush().done
        assert row(job)["run_at"] == s(8)  # seen inside the transaction
        assert first.window(1).cancel().cancelled_dependents == (dependent.pk,)
        assert first.window(1).inspect() is None
        raise RollbackError
    assert (row(job), row(dependent)) == (before, dependent_before)
    assert first.window(1).pending() is True


def test_flush_commits_with_the_callers_transaction(clock):
    job = three_calls(first, clock)
    clock(seconds=8)
    with transaction.atomic():
        first.window(1).flush()
        first.delay(1, revision=8)  # the caller's own enqueue in the same transaction
    assert (row(job)["run_at"], row(job)["enqueue_count"]) == (s(18), 4)


# -- keys ---------------------------------------------------------------------------------


def test_the_key_resolves_as_delay_resolves_it_from_a_template_and_a_callable(clock):
    job = first.delay(7)
    assert job.debounce_key == "u:7"
    assert (
        first.window(7) == first.window(user_id=7) == first.window(7, 3) == first.window_for("u:7")
    )
    assert first.window(7).inspect().job_id == job.pk  # type: ignore[union-attr]

    by_call = by_callable.delay({"id": 3, "name": "x"})
    assert by_call.debounce_key == "c:3"
    assert by_callable.window({"id": 3}).key == "c:3"
    assert by_callable.window(user={"id": 3}).inspect().job_id == by_call.pk  # type: ignore[union-attr]

    by_default = default_key.delay(1)
    assert default_key.window(1).key == default_key.window(1, 2).key == by_default.debounce_key
    assert default_key.window(a=1, b=2).inspect().job_id == by_default.pk  # type: ignore[union-attr]
    assert default_key.window(1, 3).key != by_default.debounce_key


def test_a_window_named_by_task_name_and_key_is_the_same_window(clock):
    job = three_calls(first, clock)
    by_name = Window("win.first", "u:1")
    assert by_name.inspect() == first.window(1).inspect()
    assert by_name.window_key == job.window_key
    assert Window("win.last", "u:1").inspect() is None  # same key text, another task (§3)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: plain.window(1), ConfigurationError, "task 'win.plain' is not debounced"),
        (lambda: plain.window_for("k"), ConfigurationError, "is not debounced"),
        (lambda: plain.windows([(1,)]), ConfigurationError, "is not debounced"),
        (lambda: plain.windows_for(["k"]), ConfigurationError, "is not debounced"),
        (lambda: first.window(), KeyResolutionError, "do not fit the task's signature"),
        (lambda: first.window(1, 2, 3), KeyResolutionError, "do not fit the task's signature"),
        (lambda: first.window(None), KeyResolutionError, "resolved a placeholder to None"),
        (lambda: first.window({"id": 1}), KeyResolutionError, "resolved a placeholder to dict"),
        (lambda: by_callable.window({}), KeyResolutionError, "callable"),
        (lambda: optional.window(-1), KeyResolutionError, "returned None"),
        (lambda: first.window_for(12), KeyResolutionError, "a key must be a str"),
        (lambda: first.window_for("x" * 4097), KeyResolutionError, "limit is 4096"),
        (lambda: Window("", "k"), ConfigurationError, "task name"),
        (lambda: first.windows([(1,), ()]), KeyResolutionError, "call [1]"),
        (lambda: first.windows([(1,), 2]), ConfigurationError, "call [1] is 2"),
        (
            # An alias DATABASES does not have is refused by the handle itself (decision
            # 210), before Windows could see two databases.
            lambda: Windows((Window("a", "k"), Window("a", "k", using="other"))),
            ConfigurationError,
            "using='other' is not a database alias of this project",
        ),
    ],
)
def test_bad_input_raises_the_packages_own_error_and_writes_nothing(make, error, message, clock):
    three_calls(first, clock)
    before = [row(job) for job in Job.objects.order_by("pk")]
    with transaction.atomic():
        with pytest.raises(error) as raised:
            make()
        assert Job.objects.count() == 1  # the caller's transaction is still usable
    assert message in str(raised.value)
    assert (
        "window" in str(raised.value) or "key" in str(raised.value) or "task" in str(raised.value)
    )
    assert [row(job) for job in Job.objects.order_by("pk")] == before


# -- many keys at once --------------------------------------------------------------------


def test_windows_of_many_calls_inspect_flush_and_cancel_in_one_go(django_assert_num_queries, clock):
    one = three_calls(first, clock, user_id=1)
    two = first.delay(2, revision=1)
    dependent = plain.apply_async(("after two",), depends_on=[two])
    clock(seconds=8)
    many = first.windows([(1,), (2,), (3,), (1,)])
    assert len(many) == 4 and list(many)[2] == first.window(3)
    with django_assert_num_queries(1):
        states = many.inspect()
    assert [st.job_id if st else None for st in states] == [one.pk, two.pk, None, one.pk]
    assert many.pending() == [True, True, False, True]

    flushed = many.flush()
    assert [(a.done, a.reason) for a in flushed] == [
        (True, "flushed"),
        (True, "flushed"),
        (False, "no_window"),
        (True, "flushed"),
    ]
    assert [a.window.deadline for a in flushed if a.window] == [s(8), s(8), s(8)]
    assert (row(one)["run_at"], row(two)["run_at"]) == (s(8), s(8))

    cancelled = first.windows_for(["u:2", "u:1", "u:3"]).cancel()
    assert [(a.done, a.reason) for a in cancelled] == [
        (True, "cancelled"),
        (True, "cancelled"),
        (False, "no_window"),
    ]
    assert [a.window.job_id for a in cancelled if a.window] == [two.pk, one.pk]
    assert [a.cancelled_dependents for a in cancelled] == [(dependent.pk,), (), ()]
    assert {row(j)["status"] for j in (one, two, dependent)} == {"CANCELLED"}


def test_windows_on_another_alias_name_it(clock):
    many = first.windows([(1,)]).on("default")
    assert many.alias == "default"
    assert first.window_for("u:1", using="default").using == "default"
    assert Windows(()).inspect() == [] and Windows(()).flush() == []


# -- lock contention ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # retried only outside the caller's transaction
def test_a_flush_or_cancel_that_meets_lock_contention_retries_then_gives_up(monkeypatch, clock):
    job = three_calls(first, clock)
    real = window_handles._lock_open
    failures = {"left": 2}

    def contended(windows, db):
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("database is locked")
        return real(windows, db)

    monkeypatch.setattr(window_handles, "_lock_open", contended)
    clock(seconds=8)
    assert first.window(1).flush().done  # the third attempt
    assert row(job)["run_at"] == s(8)

    failures["left"] = 100
    with pytest.raises(WindowContentionError, match="gave up after 8 attempts"):
        first.window(1).cancel()
    failures["left"] = 1
    with pytest.raises(WindowContentionError, match="inside the caller's transaction"):
        with transaction.atomic():
            first.window(1).cancel()
    assert row(job)["status"] == "READY"


def test_a_database_error_that_is_not_contention_is_raised_as_is(monkeypatch, clock):
    three_calls(first, clock)

    def broken(windows, db):
        raise OperationalError("no such table: django_debounce_job")

    monkeypatch.setattr(window_handles, "_lock_open", broken)
    with pytest.raises(OperationalError, match="no such table"):
        first.window(1).flush()
