"""Window edges (issue #21 item 2, decision 180): ``debounce_edge="leading"`` and ``"both"``.

Window 10 s, max wait 60 s; the clock never ticks on its own (§4.7), and
``burst()`` runs every job due at the frozen instant through the real worker.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job
from tests.conftest import T

pytestmark = pytest.mark.django_db

#: (task, revision, now) of every run, in order (runs are inline under ``--burst``).
RUNS: list[tuple[str, int, datetime]] = []
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    yield
    RUNS.clear()


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def _log(name: str, revision: int) -> None:
    RUNS.append((name, revision, timezone.now()))


@debounced_task(name="edge.leading", debounce_edge="leading", **WINDOW)
def leading(doc, revision=0):
    _log("edge.leading", revision)


@debounced_task(name="edge.both", debounce_edge="both", **WINDOW)
def both(doc, revision=0):
    _log("edge.both", revision)


@debounced_task(
    name="edge.both_last", debounce_edge="both", debounce_replace_payload=True, **WINDOW
)
def both_last(doc, revision=0):
    _log("edge.both_last", revision)


def _max_revision(stored, new):
    (args, kwargs), (_, new_kwargs) = stored, new
    return args, {"revision": max(kwargs.get("revision", 0), new_kwargs.get("revision", 0))}


@debounced_task(
    name="edge.both_merged", debounce_edge="both", debounce_merge=_max_revision, **WINDOW
)
def both_merged(doc, revision=0):
    _log("edge.both_merged", revision)


def calls(t, clock, burst, times, *, run_first=True):
    """Call ``t`` at each of ``times`` (seconds) with revision = the index.

    With ``run_first`` the jobs due at that instant run before the call and
    after it (so a leading job runs at its call's instant).
    """
    jobs = []
    for revision, at in enumerate(times):
        clock(seconds=at)
        if run_first:
            burst()
        jobs.append(t.delay(1, revision=revision))
        if run_first:
            burst()
    return jobs


# -- leading ------------------------------------------------------------------------------


def test_leading_runs_the_first_call_at_once_and_swallows_the_burst(clock, burst):
    first = leading.delay(1, revision=0)
    assert (first.outcome, first.run_at, first.opened_at, first.max_run_at) == (
        "created",
        T,
        T,
        s(60),
    )
    burst()
    assert RUNS == [("edge.leading", 0, T)]
    # T+3, T+7, T+16: each within 10 s of the previous call: swallowed, the quiet period slides.
    swallowed = calls(leading, clock, burst, [3, 7, 16])
    assert [(j.pk, j.outcome, j.enqueue_count) for j in swallowed] == [
        (first.pk, "debounced", 2),
        (first.pk, "debounced", 3),
        (first.pk, "debounced", 4),
    ]
    job = Job.objects.get(pk=first.pk)
    assert (job.status, job.last_enqueued_at, job.enqueue_count) == ("SUCCESSFUL", s(16), 4)
    assert job.kwargs == {"revision": 0} and job.run_at == T  # payload and deadline untouched
    clock(seconds=25.999)
    burst()
    assert len(RUNS) == 1
    # T+26 = last call + window: the window has closed, so this call opens a new burst.
    clock(seconds=26)
    again = leading.delay(1, revision=9)
    assert again.pk != first.pk and (again.outcome, again.run_at) == ("created", s(26))
    burst()
    assert RUNS == [("edge.leading", 0, T), ("edge.leading", 9, s(26))]
    assert Job.objects.count() == 2


def test_leading_calls_before_the_claim_are_swallowed_into_the_pending_job(clock, burst):
    jobs = calls(leading, clock, burst, [0, 3], run_first=False)
    assert [j.outcome for j in jobs] == ["created", "debounced"]
    assert jobs[0].pk == jobs[1].pk and jobs[1].enqueue_count == 2
    job = Job.objects.get()
    assert (job.run_at, job.window_key is not None, job.kwargs) == (T, True, {"revision": 0})
    burst()
    assert RUNS == [("edge.leading", 0, s(3))]


def test_leading_ceiling_closes_a_burst_that_never_goes_quiet(clock, burst):
    calls(leading, clock, burst, range(0, 75, 5))
    clock(seconds=200)
    burst()
    # Burst one: T+0 .. T+55 (ceiling T+60); the call at T+60 opens burst two (swallows 65, 70).
    assert RUNS == [("edge.leading", 0, T), ("edge.leading", 12, s(60))]


def test_a_cancelled_leading_job_closes_its_burst(clock, burst):
    first = leading.delay(1)
    Job.objects.filter(pk=first.pk).update(status="CANCELLED", window_key=None)
    clock(seconds=3)
    again = leading.delay(1, revision=1)
    assert (again.outcome, again.pk != first.pk) == ("created", True)
    burst()
    assert RUNS == [("edge.leading", 1, s(3))]


# -- both ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "trailing_revision"), [(both, 1), (both_last, 2), (both_merged, 2)])
def test_both_runs_the_leading_call_and_one_trailing_run_per_payload_mode(
    t, trailing_revision, clock, burst
):
    jobs = calls(t, clock, burst, [0, 3, 7])
    lead, trail, slid = jobs
    assert (lead.outcome, trail.outcome, slid.outcome) == ("created", "created", "debounced")
    assert trail.pk == slid.pk != lead.pk
    job = Job.objects.get(pk=trail.pk)
    # The trailing job carries the burst: opened at the first call, its ceiling, the last call.
    assert (job.opened_at, job.max_run_at, job.run_at, job.last_enqueued_at) == (
        T,
        s(60),
        s(17),
        s(7),
    )
    assert (job.enqueue_count, job.window_key is not None) == (2, True)
    assert Job.objects.get(pk=lead.pk).window_key is None
    clock(seconds=16.999)
    burst()
    assert len(RUNS) == 1
    clock(seconds=17)
    burst()
    assert RUNS == [(t.name, 0, T), (t.name, trailing_revision, s(17))]
    clock(seconds=100)
    burst()
    assert len(RUNS) == 2


def test_both_burst_of_one_call_runs_once(clock, burst):
    job = both.delay(1)
    burst()
    clock(seconds=30)
    burst()
    assert RUNS == [("edge.both", 0, T)]
    assert list(Job.objects.values_list("pk", "status")) == [(job.pk, "SUCCESSFUL")]


def test_both_ceiling_bounds_the_trailing_run(clock, burst):
    calls(both, clock, burst, range(0, 75, 5))
    clock(seconds=80)
    burst()
    # Lead at 0; the trailing part (first call: T+5) forced at the ceiling T+60; the call
    # at T+60 leads burst two; its trailing part (T+65, T+70) runs quiet at T+80.
    assert RUNS == [
        ("edge.both", 0, T),
        ("edge.both", 1, s(60)),
        ("edge.both", 12, s(60)),
        ("edge.both", 13, s(80)),
    ]


def test_both_second_call_before_the_claim_moves_the_window_to_the_trailing_job(clock, burst):
    lead, trail = calls(both, clock, burst, [0, 2], run_first=False)
    assert (lead.outcome, trail.outcome, trail.run_at) == ("created", "created", s(12))
    assert Job.objects.get(pk=lead.pk).window_key is None
    assert Job.objects.get(pk=trail.pk).window_key is not None
    burst()
    assert RUNS == [("edge.both", 0, s(2))]


def test_both_never_runs_the_leading_and_the_trailing_job_at_once(clock):
    lead, trail = calls(both, clock, None, [0, 3], run_first=False)
    claimed = claim_jobs(worker_id="w1", limit=10, lease=timedelta(minutes=5))
    assert [j.pk for j in claimed] == [lead.pk]
    clock(seconds=14)  # the trailing job is due, the leading one still running
    assert claim_jobs(worker_id="w2", limit=10, lease=timedelta(minutes=5)) == []
    Job.objects.filter(pk=lead.pk).update(status="SUCCESSFUL", finished_at=s(14))
    assert [j.pk for j in claim_jobs(worker_id="w2", limit=10, lease=timedelta(minutes=5))] == [
        trail.pk
    ]


def test_a_new_bursts_leading_job_waits_for_the_previous_trailing_run(clock):
    lead, trail = calls(both, clock, None, [0, 3], run_first=False)
    Job.objects.filter(pk=lead.pk).update(status="SUCCESSFUL", finished_at=T, window_key=None)
    clock(seconds=13)
    assert [j.pk for j in claim_jobs(worker_id="w1", limit=10, lease=timedelta(minutes=5))] == [
        trail.pk
    ]
    clock(seconds=30)  # the burst closed at T+13: this call leads a new one, due now
    new = both.delay(1, revision=9)
    assert (new.outcome, new.run_at) == ("created", s(30))
    assert claim_jobs(worker_id="w2", limit=10, lease=timedelta(minutes=5)) == []
    Job.objects.filter(pk=trail.pk).update(status="SUCCESSFUL", finished_at=s(30))
    assert [j.pk for j in claim_jobs(worker_id="w2", limit=10, lease=timedelta(minutes=5))] == [
        new.pk
    ]


# -- bulk ---------------------------------------------------------------------------------


def test_delay_many_honours_the_edge(clock, burst):
    jobs = leading.delay_many([(1, 0), (1, 1), (2, 2)])
    assert [j.outcome for j in jobs] == ["created", "debounced", "created"]
    assert jobs[0].pk == jobs[1].pk != jobs[2].pk
    mixed = both.delay_many([(1, 0), (1, 1), (1, 2)])
    assert [j.outcome for j in mixed] == ["created", "created", "debounced"]
    burst()
    assert sorted(RUNS) == sorted(
        [("edge.leading", 0, T), ("edge.leading", 2, T), ("edge.both", 0, T)]
    )
    clock(seconds=10)
    burst()
    assert RUNS[-1] == ("edge.both", 1, s(10))


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"debounce_edge": "leading"}, r"debounce_edge='leading' without debounce="),
        ({**WINDOW, "debounce_edge": "lead"}, r"'trailing'.*'leading'.*'both'"),
        (
            {**WINDOW, "debounce_edge": "leading", "debounce_replace_payload": True},
            r"debounce_edge='both'",
        ),
        (
            {**WINDOW, "debounce_edge": "leading", "debounce_merge": _max_revision},
            r"swallows the rest",
        ),
    ],
)
def test_bad_edges_are_refused_at_registration(options, match):
    with pytest.raises(ConfigurationError, match=match):
        task(name=f"edge.bad.{len(options)}", **options)(lambda doc: None)


def test_a_call_cannot_give_a_payload_option_or_an_edge_to_a_leading_task(
    django_assert_num_queries,
):
    with django_assert_num_queries(0):
        with pytest.raises(ConfigurationError, match="swallows the rest"):
            leading.apply_async(args=(1,), debounce_replace_payload=True)
        with pytest.raises(ConfigurationError, match="unknown enqueue option"):
            both.apply_async(args=(1,), debounce_edge="leading")


# -- window handles -----------------------------------------------------------------------


def test_inspect_shows_the_edge_and_when_the_burst_closes(clock, burst):
    leading.delay(1)
    burst()
    clock(seconds=4)
    leading.delay(1, revision=1)
    state = leading.window(1).inspect()
    # The leading job ran; its burst still swallows calls until T+14.
    assert state is not None
    assert (state.edge, state.burst_until, state.open, state.status) == (
        "leading",
        s(14),
        False,
        "SUCCESSFUL",
    )
    assert (state.calls, state.payload) == (2, ((1,), {}))
    clock(seconds=14)
    assert leading.window(1).inspect() is None
    both.delay(1)
    both.delay(1, revision=1)
    state = both.window(1).inspect()
    assert state is not None
    assert (state.edge, state.open, state.deadline, state.burst_until) == (
        "both",
        True,
        s(24),
        s(24),
    )
    assert state.payload == ((1,), {"revision": 1})


def test_a_failed_leading_job_closes_its_burst(clock, burst):
    first = leading.delay(1)
    Job.objects.filter(pk=first.pk).update(status="FAILED", window_key=None, finished_at=T)
    clock(seconds=2)
    again = leading.delay(1, revision=1)
    assert (again.outcome, again.pk != first.pk, again.run_at) == ("created", True, s(2))


def test_statements_of_an_edge_call(clock, django_assert_num_queries):
    """Each edge call is one savepoint (two statements) around its reads and writes."""
    with django_assert_num_queries(2 + 4):  # lock the burst, free window_key, insert, re-read
        leading.delay(1)
    with django_assert_num_queries(2 + 2):  # lock the burst, count the swallowed call
        leading.delay(1)
    both.delay(1)
    with django_assert_num_queries(2 + 4):  # lock the burst, move window_key, insert, re-read
        both.delay(1)
    with django_assert_num_queries(2 + 2):  # lock the burst, slide the trailing job
        both.delay(1)


@pytest.mark.django_db
def test_a_call_that_waited_for_the_keys_locks_is_no_earlier_than_the_burst_it_joins(clock):
    """A producer takes its instant, waits on the key's locks while another call opens a
    burst, then writes: its trailing job is due after the burst opened, not before (a PG
    race test saw a trailing job due 0.8 s before its leading one)."""
    from django.db import transaction

    from django_debounce.enqueueing.edges import write_edge
    from django_debounce.enqueueing.planning import plan_call

    clock(at=s(5))
    opened = both.delay(1, revision=0)
    plan = plan_call(both, both.name, [1], {"revision": 1}, {}, s(4))  # its instant: T+4
    with transaction.atomic():
        late = write_edge(plan, s(4), "default")
    assert (late.outcome, late.opened_at, late.last_enqueued_at) == ("created", s(5), s(5))
    assert late.run_at == s(15) > opened.run_at == s(5)
