"""Leading/both edges combined with flow control, handles, prune and batches (attack, decision 180).

Window 10 s, max wait 60 s, on a frozen clock (§4.7); ``burst()`` runs every
job due at the frozen instant through the real worker. Five of these pinned
defects as strict xfails, fixed by decisions 181-182: cancelling a both burst,
prune during an open burst, a both burst's dead-letter retry (a docs fix), and
enqueue_many errors that did not name their call; the others prove a
combination holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_debounce import CircuitBreaker, debounced_task, enqueue_many, registry
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import DeadLetter, Job
from django_debounce.ops.dead_letters import retry_dead_letter
from django_debounce.ops.retention import prune_jobs
from tests.conftest import T

pytestmark = pytest.mark.django_db

RUNS: list[tuple[str, int, datetime]] = []
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}
FAIL: set[int] = set()


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    FAIL.clear()
    yield
    RUNS.clear()
    FAIL.clear()


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def _log(name: str, revision: int) -> None:
    RUNS.append((name, revision, timezone.now()))
    if revision in FAIL:
        raise RuntimeError(f"revision {revision} fails")


@debounced_task(name="atk.leading", debounce_edge="leading", max_retries=0, **WINDOW)
def leading(doc, revision=0):
    _log("atk.leading", revision)


@debounced_task(name="atk.both", debounce_edge="both", max_retries=0, **WINDOW)
def both(doc, revision=0):
    _log("atk.both", revision)


@debounced_task(
    name="atk.leading_dropped",
    debounce_edge="leading",
    rate_limit="1/m",
    on_excess="drop",
    **WINDOW,
)
def leading_dropped(doc, revision=0):
    _log("atk.leading_dropped", revision)


@debounced_task(
    name="atk.leading_capped", debounce_edge="leading", concurrency=1, max_retries=0, **WINDOW
)
def leading_capped(doc, revision=0):
    _log("atk.leading_capped", revision)


@debounced_task(
    name="atk.both_guarded",
    debounce_edge="both",
    max_retries=0,
    circuit_breaker=CircuitBreaker(failures=1, reset="1m"),
    **WINDOW,
)
def both_guarded(doc, revision=0):
    _log("atk.both_guarded", revision)


def _no_call(stored, new):
    return None


@debounced_task(
    name="atk.both_broken_merge", debounce_edge="both", debounce_merge=_no_call, **WINDOW
)
def both_broken_merge(doc, revision=0):
    _log("atk.both_broken_merge", revision)


@debounced_task(name="atk.leading_deferred", debounce_edge="leading", rate_limit="1/m", **WINDOW)
def leading_deferred(doc, revision=0):
    _log("atk.leading_deferred", revision)


@debounced_task(
    name="atk.leading_expiring",
    debounce_edge="leading",
    expires="60s",
    max_retries=0,
    circuit_breaker=CircuitBreaker(failures=1, reset="5m"),
    **WINDOW,
)
def leading_expiring(doc, revision=0):
    _log("atk.leading_expiring", revision)


@debounced_task(name="atk.trailing", **WINDOW)
def trailing(doc, revision=0):
    _log("atk.trailing", revision)


#: The gated tasks (rate limit, cap, breaker) are registered only while a test of this module
#: runs: registered at import, they would send every other claim of the test process
#: through the gate (tests/db/worker/test_worker.py names any such task).
GATED = (leading_dropped, leading_capped, both_guarded, leading_deferred, leading_expiring)
for _gated in GATED:
    registry.unregister(_gated.name)


@pytest.fixture(autouse=True)
def _gated_tasks():
    for gated in GATED:
        registry.register(gated)
    yield
    for gated in GATED:
        registry.unregister(gated.name)


def statuses(name: str) -> list[tuple[int, str]]:
    return list(Job.objects.filter(task_name=name).order_by("pk").values_list("pk", "status"))


# -- flow control -------------------------------------------------------------------------


def test_a_shed_leading_job_closes_its_burst_and_the_next_call_opens_one(clock, burst):
    """Rate limit with on_excess="drop": a shed leading job ends its burst (SHED closes it)."""
    leading_dropped.delay(1, revision=0)
    burst()
    clock(seconds=20)  # the first burst closed quietly at T+10; the token is spent
    shed = leading_dropped.delay(1, revision=1)
    burst()
    assert Job.objects.get(pk=shed.pk).status == "SHED"
    clock(seconds=21)
    again = leading_dropped.delay(1, revision=2)
    assert (again.outcome, again.pk != shed.pk, again.run_at) == ("created", True, s(21))
    clock(seconds=61)
    burst()
    assert [r[:2] for r in RUNS] == [("atk.leading_dropped", 0), ("atk.leading_dropped", 2)]


def test_a_failed_leading_job_closes_its_burst_and_its_retried_letter_joins_the_next(clock, burst):
    """The failed job's burst is closed; its dead letter, retried later, is a call made then."""
    FAIL.add(0)
    first = leading.delay(1, revision=0)
    burst()
    assert Job.objects.get(pk=first.pk).status == "FAILED"
    # The failed job closed the burst: the next call opens a new one and runs at once.
    clock(seconds=2)
    second = leading.delay(1, revision=1)
    assert (second.outcome, second.pk != first.pk) == ("created", True)
    burst()
    # The dead letter's retry, mid-burst of the second call: swallowed by that open burst.
    clock(seconds=3)
    retried = retry_dead_letter(DeadLetter.objects.get())
    assert retried is not None and (retried.pk, retried.outcome) == (second.pk, "debounced")
    burst()
    assert [r[1] for r in RUNS] == [0, 1]


def test_a_rate_limited_leading_job_waits_for_a_token_and_its_burst_swallows_meanwhile(
    clock, burst
):
    leading_deferred.delay(1, revision=0)
    burst()
    clock(seconds=20)  # the first burst closed; the minute's token is spent
    second = leading_deferred.delay(2, revision=1)
    burst()
    assert Job.objects.get(pk=second.pk).status == "READY"  # deferred, not shed
    clock(seconds=25)
    swallowed = leading_deferred.delay(2, revision=2)
    assert (swallowed.pk, swallowed.outcome) == (second.pk, "debounced")
    clock(seconds=61)
    burst()
    assert [r[1] for r in RUNS] == [0, 1]


def test_leading_jobs_held_by_a_breaker_past_their_expiry_never_run(clock, burst):
    FAIL.add(0)
    leading_expiring.delay(9, revision=0)
    burst()  # fails: the breaker opens for five minutes
    clock(seconds=1)
    held = leading_expiring.delay(1, revision=1)
    clock(seconds=5)
    leading_expiring.delay(1, revision=2)  # swallowed by the held job
    clock(seconds=62)  # the held job's expiry (T+61) has passed; its burst closed at T+15
    again = leading_expiring.delay(1, revision=3)
    assert (again.outcome, again.pk != held.pk) == ("created", True)
    clock(seconds=400)  # the breaker lets a probe through: neither held job ever runs
    burst()
    burst()  # a claim expires the key's first held job; the next one, the second
    assert Job.objects.get(pk=held.pk).status == "EXPIRED"
    assert Job.objects.get(pk=again.pk).status == "EXPIRED"
    assert [r[1] for r in RUNS] == [0]


def test_a_concurrency_cap_holds_another_keys_leading_job_and_its_burst_still_swallows(clock):
    one = leading_capped.delay(1, revision=0)
    two = leading_capped.delay(2, revision=1)
    lease = timedelta(minutes=5)
    assert [j.pk for j in claim_jobs(worker_id="w1", limit=10, lease=lease)] == [one.pk]
    clock(seconds=3)
    assert claim_jobs(worker_id="w2", limit=10, lease=lease) == []  # the cap is full
    held = leading_capped.delay(2, revision=2)
    assert (held.pk, held.outcome) == (two.pk, "debounced")
    Job.objects.filter(pk=one.pk).update(status="SUCCESSFUL", finished_at=s(3))
    (claimed,) = claim_jobs(worker_id="w2", limit=10, lease=lease)
    assert (claimed.pk, claimed.kwargs) == (two.pk, {"revision": 1})


def test_an_open_breaker_holds_a_both_burst_whose_trailing_job_runs_after_it_closes(clock, burst):
    FAIL.add(0)
    both_guarded.delay(9, revision=0)
    burst()  # fails: the breaker opens for a minute
    clock(seconds=1)
    lead = both_guarded.delay(1, revision=1)
    clock(seconds=2)
    trail = both_guarded.delay(1, revision=2)
    clock(seconds=30)
    burst()
    assert [r[1] for r in RUNS] == [0]
    assert Job.objects.get(pk=lead.pk).status == "READY"  # held by the open breaker
    clock(seconds=62)
    burst()
    clock(seconds=63)
    burst()
    assert [r[1] for r in RUNS] == [0, 1, 2]
    assert Job.objects.get(pk=trail.pk).status == "SUCCESSFUL"


def test_the_dead_letter_of_a_both_bursts_leading_job_is_a_call_made_now(clock, burst):
    """Decision 182: a retry is a call made now (§8); inside the open burst it is gathered."""
    FAIL.add(0)
    both.delay(1, revision=0)
    clock(seconds=2)
    trail = both.delay(1, revision=1)  # the burst's second call: its trailing job
    burst()  # the leading job fails (no retries left): a dead letter
    assert [r[1] for r in RUNS] == [0] and DeadLetter.objects.count() == 1
    FAIL.clear()
    clock(seconds=3)
    letter = DeadLetter.objects.get()
    retried = retry_dead_letter(letter)
    # The burst is still open (its newest job, the trailing one, waits): the retry joins it,
    # as any call at T+3 would, and the key gets a run after it, the trailing job's.
    assert retried is not None and (retried.pk, retried.outcome) == (trail.pk, "debounced")
    clock(seconds=20)
    burst()
    assert [r[1] for r in RUNS] == [0, 1]
    # Once the burst has closed, a retry opens a new burst and runs the failed call at once.
    clock(seconds=21)
    again = retry_dead_letter(letter, force=True)
    assert again is not None and (again.outcome, again.run_at) == ("created", s(21))
    burst()
    assert [r[1] for r in RUNS] == [0, 1, 0]


def test_a_new_leading_burst_waits_while_the_previous_leading_run_is_still_running(clock):
    lead = leading.delay(1, revision=0)
    lease = timedelta(minutes=5)
    assert [j.pk for j in claim_jobs(worker_id="w1", limit=10, lease=lease)] == [lead.pk]
    clock(seconds=30)  # the burst closed at T+10; its run goes on
    new = leading.delay(1, revision=1)
    assert (new.outcome, new.run_at) == ("created", s(30))
    assert claim_jobs(worker_id="w2", limit=10, lease=lease) == []
    Job.objects.filter(pk=lead.pk).update(status="SUCCESSFUL", finished_at=s(31))
    assert [j.pk for j in claim_jobs(worker_id="w2", limit=10, lease=lease)] == [new.pk]


# -- window handles -----------------------------------------------------------------------


def test_cancelling_a_both_burst_before_any_claim_cancels_its_pending_leading_job(clock, burst):
    lead = both.delay(1, revision=0)
    clock(seconds=2)
    trail = both.delay(1, revision=1)
    action = both.window(1).cancel()
    assert (action.done, action.reason, action.window.job_id) == (True, "cancelled", trail.pk)
    burst()
    # As for a leading burst (whose pending job the cancel ends), nothing of the burst runs.
    assert RUNS == [] and Job.objects.get(pk=lead.pk).status == "CANCELLED"
    assert both.window(1).inspect() is None  # the burst is closed: nothing pending, nothing open
    clock(seconds=3)
    again = both.delay(1, revision=2)  # the next call opens a new burst and runs at once
    assert (again.outcome, again.run_at) == ("created", s(3))
    burst()
    assert [r[1] for r in RUNS] == [2]


def test_cancelling_a_both_burst_leaves_its_claimed_leading_job_alone(clock):
    lead = both.delay(1, revision=0)
    lease = timedelta(minutes=5)
    assert [j.pk for j in claim_jobs(worker_id="w1", limit=10, lease=lease)] == [lead.pk]
    clock(seconds=1)
    trail = both.delay(1, revision=1)
    action = both.window(1).cancel()
    assert (action.done, action.window.job_id) == (True, trail.pk)
    assert Job.objects.get(pk=lead.pk).status == "RUNNING"  # a claimed job is never changed


def test_cancelling_a_pending_leading_burst_ends_it(clock, burst):
    lead = leading.delay(1, revision=0)
    clock(seconds=2)
    leading.delay(1, revision=1)
    action = leading.window(1).cancel()
    assert (action.done, action.reason, action.window.job_id) == (True, "cancelled", lead.pk)
    burst()
    assert RUNS == []
    clock(seconds=3)
    assert leading.delay(1, revision=2).outcome == "created"


def test_flush_and_cancel_of_a_running_leading_job_report_claimed(clock):
    lead = leading.delay(1, revision=0)
    (claimed,) = claim_jobs(worker_id="w1", limit=10, lease=timedelta(minutes=5))
    assert claimed.pk == lead.pk
    clock(seconds=1)
    swallowed = leading.delay(1, revision=1)
    assert (swallowed.pk, swallowed.outcome) == (lead.pk, "debounced")
    for action in (leading.window(1).flush(), leading.window(1).cancel()):
        assert (action.done, action.reason, action.window.job_id) == (False, "claimed", lead.pk)
    job = Job.objects.get(pk=lead.pk)
    assert (job.status, job.enqueue_count, job.kwargs) == ("RUNNING", 2, {"revision": 0})


def test_flushing_a_both_bursts_trailing_job_while_its_leading_job_runs_waits_for_it(clock):
    lead = both.delay(1, revision=0)
    lease = timedelta(minutes=5)
    assert [j.pk for j in claim_jobs(worker_id="w1", limit=10, lease=lease)] == [lead.pk]
    clock(seconds=1)
    trail = both.delay(1, revision=1)
    action = both.window(1).flush()
    assert (action.done, action.reason, action.window.job_id) == (True, "flushed", trail.pk)
    assert claim_jobs(worker_id="w2", limit=10, lease=lease) == []  # one run of a key at once
    Job.objects.filter(pk=lead.pk).update(status="SUCCESSFUL", finished_at=s(1))
    assert [j.pk for j in claim_jobs(worker_id="w2", limit=10, lease=lease)] == [trail.pk]


def test_handles_on_a_leading_burst_while_running_and_after_it_failed(clock):
    lead = leading.delay(1, revision=0)
    lease = timedelta(minutes=5)
    claim_jobs(worker_id="w1", limit=10, lease=lease)
    state = leading.window(1).inspect()
    assert state is not None and (state.job_id, state.running, state.open) == (lead.pk, True, False)
    assert leading.window(1).pending() is False
    Job.objects.filter(pk=lead.pk).update(status="FAILED", finished_at=T, lease_expires_at=None)
    clock(seconds=1)
    assert leading.window(1).inspect() is None  # a failed burst is closed
    assert [a.reason for a in (leading.window(1).flush(), leading.window(1).cancel())] == [
        "no_window",
        "no_window",
    ]


# -- prune --------------------------------------------------------------------------------


def test_prune_keeps_the_leading_job_of_an_open_burst(clock, burst):
    leading.delay(1, revision=0)
    burst()
    clock(seconds=5)
    prune_jobs(older_than=timedelta(seconds=1))
    clock(seconds=6)
    swallowed = leading.delay(1, revision=1)  # within the burst (quiet until T+10)
    burst()
    assert swallowed.outcome == "debounced" and [r[1] for r in RUNS] == [0]


def test_prune_deletes_a_bursts_jobs_once_their_ceiling_has_passed(clock, burst):
    lead = leading.delay(1, revision=0)
    burst()
    clock(seconds=5)
    flushed = trailing.delay(1, revision=0)
    trailing.window(1).flush()
    burst()  # a trailing window run early: its ceiling (T+65) is still ahead too
    clock(seconds=59)
    assert prune_jobs(older_than=timedelta(seconds=1)).jobs == 0
    clock(seconds=60)  # the leading job's ceiling (T+60) has passed; its burst is closed
    assert prune_jobs(older_than=timedelta(seconds=1)).jobs == 1
    assert not Job.objects.filter(pk=lead.pk).exists()
    clock(seconds=65)
    assert prune_jobs(older_than=timedelta(seconds=1)).jobs == 1
    assert not Job.objects.filter(pk=flushed.pk).exists()


# -- batches ------------------------------------------------------------------------------


def test_a_batch_mixing_edges_with_bad_input_in_the_middle_writes_nothing(clock):
    with pytest.raises(ConfigurationError, match=r"enqueue_many: call \[2\].*swallows the rest"):
        enqueue_many(
            [
                (leading, (1,), {"revision": 0}),
                (trailing, (1,), {"revision": 0}),
                (leading, (2,), {}, {"debounce_replace_payload": True}),
                (both, (1,), {}),
            ]
        )
    assert Job.objects.count() == 0


def test_a_batch_whose_leading_call_names_a_missing_dependency_says_which_call(clock):
    with pytest.raises(ConfigurationError, match=r"^enqueue_many: call \[1\]"):
        enqueue_many(
            [
                (trailing, (1,), {}),
                (leading, (1,), {}, {"depends_on": [987654]}),
                (trailing, (2,), {}, {"depends_on": [987654]}),
                (both, (1,), {}),
            ]
        )
    assert Job.objects.count() == 0


def test_a_batch_mixing_leading_both_and_trailing_calls_of_one_key(clock, burst):
    jobs = enqueue_many(
        [
            (leading, (1,), {"revision": 0}),
            (trailing, (1,), {"revision": 1}),
            (both, (1,), {"revision": 2}),
            (leading, (1,), {"revision": 3}),
            (both, (1,), {"revision": 4}),
            (trailing, (1,), {"revision": 5}),
        ]
    )
    assert [j.outcome for j in jobs] == [
        "created",
        "created",
        "created",
        "debounced",
        "created",
        "debounced",
    ]
    burst()
    clock(seconds=10)
    burst()
    assert sorted(r[:2] for r in RUNS) == sorted(
        [("atk.leading", 0), ("atk.both", 2), ("atk.both", 4), ("atk.trailing", 1)]
    )


BROKEN_MERGE_BATCH = [
    (trailing, (1,), {}),
    (both_broken_merge, (1,), {"revision": 0}),
    (both_broken_merge, (1,), {"revision": 1}),  # creates the trailing job
    (both_broken_merge, (1,), {"revision": 2}),  # merges: the function returns None
]


def test_a_batch_whose_both_merge_returns_no_call_writes_nothing(clock):
    with pytest.raises(ConfigurationError, match="returned None; it must return"):
        enqueue_many(BROKEN_MERGE_BATCH)
    assert Job.objects.count() == 0


def test_a_batch_whose_both_merge_returns_no_call_says_which_call(clock):
    with pytest.raises(ConfigurationError, match=r"^enqueue_many: call \[3\]"):
        enqueue_many(BROKEN_MERGE_BATCH)


def test_many_windows_of_leading_and_both_bursts_in_one_call(clock, burst):
    leading.delay(1, revision=0)
    burst()  # key 1 ran; its burst still swallows
    clock(seconds=1)
    pending = leading.delay(2, revision=0)
    results = leading.windows([(1,), (2,), (3,)]).cancel()
    assert [a.reason for a in results] == ["no_window", "cancelled", "no_window"]
    assert Job.objects.get(pk=pending.pk).status == "CANCELLED"
    states = leading.windows([(1,), (2,)]).inspect()
    assert states[0] is not None and (states[0].status, states[0].open) == ("SUCCESSFUL", False)
    assert states[1] is None


# -- depends_on ---------------------------------------------------------------------------


def test_a_leading_job_waits_for_its_dependency_and_is_cancelled_with_it(clock, burst):
    FAIL.add(7)
    dep = trailing.delay(9, revision=7)
    lead = leading.apply_async(args=(1,), kwargs={"revision": 0}, depends_on=[dep])
    burst()
    assert Job.objects.get(pk=lead.pk).status == "READY"  # waits for the trailing dependency
    clock(seconds=10)
    burst()
    assert Job.objects.get(pk=lead.pk).status == "READY"  # the dependency runs first
    clock(seconds=11)
    burst()
    assert Job.objects.get(pk=lead.pk).status in ("READY", "SUCCESSFUL")
