"""Enqueue (contract §2, §4, §6, §11): per-call errors, the §4 worked scenarios, outcomes."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job
from django_debounce.worker.loop import Worker
from tests.conftest import T

#: (task, key, payload, now) of every run, in order (runs are inline under ``--burst``).
RUNS: list[tuple[str, object, object, datetime]] = []
#: Callables a running ``charge`` job calls (to enqueue while it is RUNNING).
DURING_CHARGE: list = []
STARTED = threading.Event()
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    DURING_CHARGE.clear()
    STARTED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()
    RUNS.clear()
    DURING_CHARGE.clear()


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def snapshot(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "s:{0}"}


@debounced_task(name="enq.scenario", **WINDOW)
def scenario(key, payload=None):
    RUNS.append(("scenario", key, payload, timezone.now()))


@debounced_task(name="enq.scenario_replace", debounce_replace_payload=True, **WINDOW)
def scenario_replace(key, payload=None):
    RUNS.append(("scenario_replace", key, payload, timezone.now()))


@debounced_task(name="enq.flaky", max_retries=2, **WINDOW)
def flaky(key, payload=None):
    raise RuntimeError("down")


@debounced_task(name="enq.blocking", **WINDOW)
def blocking(key, payload=None):
    STARTED.set()
    assert RELEASE.wait(20)
    RUNS.append(("blocking", key, payload, timezone.now()))


@task(name="enq.plain")
def plain(*args, **kwargs):
    RUNS.append(("plain", args, kwargs, timezone.now()))


@task(name="enq.charge", unique_key="charge:{0}")
def charge(account, amount):
    RUNS.append(("charge", account, amount, timezone.now()))
    for hook in DURING_CHARGE:
        hook(account)


@task(name="enq.idem", idempotent=True)
def idem(a, b=0):
    RUNS.append(("idem", a, b, timezone.now()))


# -- per-call errors (§2): raised before anything is written ---------------------------------


def _merge(stored, new):
    return stored


PER_CALL_ERRORS = [
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce_wait="5s"), "debounce_wait", id="unknown-option"),
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce="2m"), "shorter than the window", id="window-over-max-wait"),
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce_max_wait="5s"), "shorter than the window", id="max-wait-under-window"),
    pytest.param(lambda: scenario.apply_async(("e", 1), countdown=5), "countdown/eta", id="countdown"),
    pytest.param(lambda: scenario.apply_async(("e", 1), eta=s(3600)), "countdown/eta", id="eta"),
    pytest.param(lambda: scenario.apply_async(("e", 1), expires="30s"), "expires", id="expires-under-max-wait"),
    pytest.param(lambda: scenario.apply_async(("e", 1), expires=s(30)), "expires", id="expires-datetime-early"),
    pytest.param(lambda: scenario.apply_async(("e", 1), unique_key="u:{0}"), "unique key", id="unique-key"),
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce_merge=_merge, debounce_replace_payload=True), "debounce_merge", id="merge-and-replace"),
    pytest.param(lambda: scenario_replace.apply_async(("e", 1), debounce_merge=_merge), "debounce_merge", id="merge-on-replace-task"),
    pytest.param(lambda: scenario.apply_async(("e", 1), priority=101), "-100 to 100", id="priority-101"),
    pytest.param(lambda: scenario.apply_async(("e", 1), priority=-101), "-100 to 100", id="priority--101"),
    pytest.param(lambda: scenario.apply_async(("e", 1), priority="high"), "-100 to 100", id="priority-high"),
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce="5 minutes"), "debounce=", id="bad-duration"),
    pytest.param(lambda: scenario.apply_async(("e", 1), debounce="0s"), "debounce=", id="zero-window"),
    pytest.param(lambda: scenario.apply_async(("e", 1), queue=""), "queue", id="empty-queue"),
    pytest.param(lambda: scenario.apply_async(("e", 1), max_retries=-1), "max_retries", id="max-retries"),
    pytest.param(lambda: scenario.apply_async(("e", 1), metadata=["x"]), "metadata", id="metadata"),
    pytest.param(lambda: scenario.apply_async("e"), "args", id="args-not-a-sequence"),
    pytest.param(lambda: plain.apply_async((1,), eta=datetime(2026, 3, 1, 13, 0)), "aware", id="naive-eta"),
    pytest.param(lambda: plain.apply_async((1,), expires=datetime(2026, 3, 1, 13, 0)), "naive", id="naive-expires"),
    pytest.param(lambda: plain.apply_async((1,), countdown=5, eta=s(5)), "not both", id="countdown-and-eta"),
    pytest.param(lambda: plain.apply_async((1,), countdown=-1), "countdown", id="negative-countdown"),
    pytest.param(lambda: plain.apply_async((1,), debounce_key="k"), "not debounced", id="key-without-window"),
    pytest.param(lambda: plain.apply_async((1,), debounce="10s"), "debounce_max_wait", id="window-without-max-wait"),
    pytest.param(lambda: plain.apply_async((1,), debounce="10s", debounce_max_wait="1m", unique_key="u"), "unique key", id="debounce-and-unique-per-call"),
    pytest.param(lambda: idem.apply_async((1,), debounce="10s", debounce_max_wait="1m"), "unique key", id="debounce-on-idempotent"),
    pytest.param(lambda: charge.apply_async((1, 2), debounce="10s", debounce_max_wait="1m"), "unique key", id="debounce-on-unique-task"),
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize(("call", "match"), PER_CALL_ERRORS)
def test_per_call_errors_write_nothing(clock, django_assert_num_queries, call, match):
    window = scenario.delay("e", 0)
    before = snapshot(fresh(window))
    clock(seconds=1)
    with django_assert_num_queries(0), pytest.raises(ConfigurationError, match=match) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert Job.objects.count() == 1
    assert snapshot(fresh(window)) == before


# -- the §4 worked scenarios (window 10 s, max wait 60 s) -----------------------------------


@pytest.mark.django_db
def test_one_enqueue_runs_once_at_t10(clock, burst):
    job = scenario.delay("a", "p")
    assert (job.outcome, job.run_at, job.opened_at, job.max_run_at) == ("created", s(10), T, s(60))
    clock(seconds=9.999999)
    burst()
    assert RUNS == []
    clock(seconds=10)
    burst()
    burst()
    assert RUNS == [("scenario", "a", "p", s(10))]
    row = fresh(job)
    assert (row.status, row.started_at, row.attempts) == (Job.Status.SUCCESSFUL, s(10), 1)


@pytest.mark.django_db
@pytest.mark.parametrize(("task_obj", "expected"), [(scenario, "p0"), (scenario_replace, "p7")])
def test_burst_at_0_3_7_is_one_run_at_t17(clock, burst, task_obj, expected):
    jobs = []
    for t in (0, 3, 7):
        clock(seconds=t)
        jobs.append(task_obj.delay("b", f"p{t}"))
        assert fresh(jobs[-1]).run_at == s(t + 10)
    assert {j.pk for j in jobs} == {jobs[0].pk}
    assert [j.outcome for j in jobs] == ["created", "debounced", "debounced"]
    row = Job.objects.get()
    assert (row.run_at, row.opened_at, row.max_run_at) == (s(17), T, s(60))
    assert (row.enqueue_count, row.last_enqueued_at, row.created_at) == (3, s(7), T)
    clock(seconds=16.999)
    burst()
    assert RUNS == []
    clock(seconds=17)
    burst()
    assert RUNS == [(task_obj.name.removeprefix("enq."), "b", expected, s(17))]


@pytest.mark.django_db
def test_every_5s_for_two_minutes_runs_at_60_120_130(clock, burst):
    runs_seen = []
    for t in range(0, 121, 5):
        clock(seconds=t)
        burst()  # run what is due first, then enqueue at the same instant
        runs_seen.append((t, len(RUNS)))
        scenario.delay("c", t)
        assert Job.objects.open_windows().count() == 1
    clock(seconds=129.999)
    burst()
    assert len(RUNS) == 2
    clock(seconds=130)
    burst()
    assert RUNS == [
        ("scenario", "c", 0, s(60)),
        ("scenario", "c", 60, s(120)),
        ("scenario", "c", 120, s(130)),
    ]
    # Nothing ran except at 60 and 120 during the stream: never starved, never early.
    assert [t for (_, n), (t, m) in zip(runs_seen, runs_seen[1:], strict=False) if m > n] == [
        60,
        120,
    ]
    jobs = list(Job.objects.order_by("id"))
    assert [(j.opened_at, j.max_run_at, j.enqueue_count) for j in jobs] == [
        (T, s(60), 12),
        (s(60), s(120), 12),
        (s(120), s(180), 1),
    ]
    assert [j.last_enqueued_at for j in jobs] == [s(55), s(115), s(120)]
    assert {j.status for j in jobs} == {Job.Status.SUCCESSFUL}


@pytest.mark.django_db
def test_enqueue_after_the_run_opens_a_second_window(clock, burst):
    first = scenario.delay("d", 1)
    clock(seconds=10)
    burst()
    clock(seconds=25)
    second = scenario.delay("d", 2)
    assert second.outcome == "created" and second.pk != first.pk
    assert (second.opened_at, second.run_at, second.max_run_at) == (s(25), s(35), s(85))
    clock(seconds=35)
    burst()
    assert RUNS == [("scenario", "d", 1, s(10)), ("scenario", "d", 2, s(35))]
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == 2


@pytest.mark.django_db
def test_claimed_job_is_untouched_and_a_new_window_opens(clock, burst):
    j1 = scenario.delay("e", "first")
    clock(seconds=10)
    claimed = claim_jobs(worker_id="enq-w1", limit=10, lease=timedelta(seconds=60))
    assert [j.pk for j in claimed] == [j1.pk]
    before = snapshot(fresh(j1))
    assert not fresh(j1).is_open_window
    clock(seconds=10.001)
    j2 = scenario.delay("e", "second")
    assert j2.outcome == "created" and j2.pk != j1.pk
    assert snapshot(fresh(j1)) == before
    assert (before["status"], before["args"], before["run_at"]) == (
        Job.Status.RUNNING,
        ["e", "first"],
        s(10),
    )
    row = fresh(j2)
    assert (row.status, row.opened_at, row.run_at, row.max_run_at) == (
        Job.Status.READY,
        s(10.001),
        s(20.001),
        s(70.001),
    )
    assert (row.args, row.enqueue_count, row.is_open_window) == (["e", "second"], 1, True)
    # A second call slides the new window, not the running job.
    clock(seconds=12)
    assert scenario.delay("e", "third").pk == j2.pk
    assert snapshot(fresh(j1)) == before
    # The new job waits while the earlier run of its key is in flight (§4.5).
    clock(seconds=22)
    burst()
    assert RUNS == [] and fresh(j2).status == Job.Status.READY


@pytest.mark.django_db(transaction=True)
def test_enqueue_while_a_worker_thread_runs_the_job(clock, burst):
    j1 = blocking.delay("f", "first")
    clock(seconds=10)
    worker = Worker(concurrency=1, poll_interval=0.02, max_jobs=1, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert STARTED.wait(10)
        running = fresh(j1)
        assert (running.status, running.started_at) == (Job.Status.RUNNING, s(10))
        before = snapshot(running)
        clock(seconds=10.001)
        j2 = blocking.delay("f", "second")
        assert j2.outcome == "created" and j2.pk != j1.pk
        assert fresh(j2).run_at == s(20.001)
        after = snapshot(fresh(j1))
        after.pop("lease_expires_at"), before.pop("lease_expires_at")  # only the lease may move
        assert after == before
    finally:
        RELEASE.set()
        thread.join(10)
    assert not thread.is_alive()
    assert fresh(j1).status == Job.Status.SUCCESSFUL
    assert RUNS == [("blocking", "f", "first", s(10.001))]
    clock(seconds=20.001)
    burst()
    assert RUNS[1:] == [("blocking", "f", "second", s(20.001))]


@pytest.mark.django_db
def test_per_call_window_and_the_fixed_ceiling(clock):
    job = scenario.delay("g", 0)
    assert (job.run_at, job.max_run_at) == (s(10), s(60))
    clock(seconds=1)
    urgent = scenario.apply_async(("g", 1), debounce="500ms")
    assert (urgent.pk, urgent.run_at) == (job.pk, s(1.5))  # pulled earlier
    clock(seconds=5)  # due but unclaimed: still open, still slides
    assert fresh(job).is_open_window
    later = scenario.apply_async(("g", 2), debounce_max_wait="2h")
    assert (later.run_at, later.max_run_at) == (s(15), s(60))
    clock(seconds=40)
    longer = scenario.apply_async(("g", 3), debounce="90s", debounce_max_wait="2h")
    assert (longer.run_at, longer.max_run_at, longer.opened_at) == (s(60), s(60), T)
    clock(seconds=59)
    at_ceiling = scenario.delay("g", 4)
    assert (at_ceiling.run_at, at_ceiling.enqueue_count) == (s(60), 5)


@pytest.mark.django_db
def test_is_open_window_is_false_for_a_retry_waiting_job(clock, burst):
    j1 = flaky.delay("h", 1)
    assert fresh(j1).is_open_window
    clock(seconds=10)
    burst()
    waiting = fresh(j1)
    assert (waiting.status, waiting.attempts, waiting.window_key) == (Job.Status.READY, 1, None)
    assert s(12.5) <= waiting.run_at <= s(15)  # first retry: min_backoff 5 s, jittered
    assert not waiting.is_open_window
    before = snapshot(waiting)
    j2 = flaky.delay("h", 2)
    assert j2.outcome == "created" and j2.pk != j1.pk
    assert snapshot(fresh(j1)) == before
    assert fresh(j2).is_open_window


# -- outcomes and the returned row ------------------------------------------------------------


@pytest.mark.django_db
def test_returned_job_shows_the_row_after_the_enqueue(clock):
    created = scenario_replace.apply_async(("i", 1), priority=3, metadata={"m": 1}, notes="n")
    assert snapshot(created) == snapshot(fresh(created))
    clock(seconds=4)
    slid = scenario_replace.delay("i", 2)
    assert snapshot(slid) == snapshot(fresh(slid))
    assert (slid.args, slid.enqueue_count, slid.run_at, slid.last_enqueued_at) == (
        ["i", 2],
        2,
        s(14),
        s(4),
    )
    coalesced_first = charge.delay("acct", 1)
    coalesced = charge.delay("acct", 2)
    assert snapshot(coalesced) == snapshot(fresh(coalesced)) == snapshot(coalesced_first)


@pytest.mark.django_db
def test_a_slide_keeps_the_openers_options(clock):
    opener = scenario.apply_async(
        ("j", 1), priority=5, queue="a", metadata={"x": 1}, notes="first", expires="2m"
    )
    assert (opener.priority, opener.queue, opener.expires_at) == (5, "a", s(120))
    clock(seconds=3)
    slid = scenario.apply_async(
        ("j", 2), priority=-5, queue="b", metadata={"y": 2}, notes="second", expires="5m"
    )
    assert slid.pk == opener.pk and slid.outcome == "debounced"
    row = fresh(opener)
    assert (row.priority, row.queue, row.metadata, row.notes, row.expires_at) == (
        5,
        "a",
        {"x": 1},
        "first",
        s(120),
    )
    assert (row.args, row.run_at, row.enqueue_count) == (["j", 1], s(13), 2)


@pytest.mark.django_db
def test_expires_equal_to_max_wait_is_allowed(clock):
    job = scenario.apply_async(("k", 1), expires="60s")
    assert job.expires_at == job.max_run_at == s(60)


@pytest.mark.django_db
def test_plain_job_timing_options(clock):
    now = plain.delay(1)
    later = plain.apply_async((2,), countdown="1m30s")
    at = plain.apply_async((3,), eta=s(7))
    zero = plain.apply_async((4,), countdown=0)
    assert [(j.outcome, j.run_at, j.opened_at) for j in (now, later, at, zero)] == [
        ("created", T, None),
        ("created", s(90), None),
        ("created", s(7), None),
        ("created", T, None),
    ]


@pytest.mark.django_db
def test_unique_key_coalesces_into_the_ready_and_the_running_job(clock, burst):
    first = charge.delay("acct", 10)
    assert (first.outcome, first.run_at, first.unique_key) == ("created", T, "charge:acct")
    before = snapshot(fresh(first))
    clock(seconds=1)
    again = charge.delay("acct", 20)
    assert (again.outcome, again.pk, again.run_at) == ("coalesced", first.pk, T)
    assert snapshot(fresh(first)) == before  # nothing moves, not even the count
    other = charge.delay("other", 1)
    assert other.outcome == "created" and other.pk != first.pk

    inside = []
    DURING_CHARGE.append(
        lambda account: account == "acct" and inside.append(charge.delay("acct", 30))
    )
    burst()
    assert [(j.pk, j.outcome, j.status, j.args) for j in inside] == [
        (first.pk, "coalesced", Job.Status.RUNNING, ["acct", 10])
    ]
    assert [r[:3] for r in RUNS] == [("charge", "acct", 10), ("charge", "other", 1)]
    assert Job.objects.count() == 2
    DURING_CHARGE.clear()

    after = charge.delay("acct", 40)
    assert after.outcome == "created" and after.pk not in (first.pk, other.pk)
    assert fresh(first).status == Job.Status.SUCCESSFUL


@pytest.mark.django_db
def test_idempotent_coalesces_equal_bound_arguments(clock, burst):
    first = idem.delay(1, 2)
    assert first.outcome == "created"
    assert [idem.delay(1, b=2).outcome, idem.delay(a=1, b=2).outcome] == ["coalesced"] * 2
    assert idem.delay(a=1, b=2).pk == first.pk
    assert idem.delay(1).pk == idem.delay(1, 0).pk != first.pk
    assert idem.delay(1, 3).outcome == "created"
    assert Job.objects.count() == 3
    burst()
    assert sorted(r[1:3] for r in RUNS) == [(1, 0), (1, 2), (1, 3)]
    renewed = idem.delay(1, 2)
    assert renewed.outcome == "created" and renewed.pk != first.pk


@pytest.mark.django_db
def test_per_call_unique_key_on_a_plain_task(clock):
    first = plain.apply_async((1,), unique_key="p:{0}")
    second = plain.apply_async((1, "x"), unique_key="p:{0}")
    third = plain.apply_async((2,), unique_key="p:{0}")
    assert [j.outcome for j in (first, second, third)] == ["created", "coalesced", "created"]
    assert second.pk == first.pk and second.args == [1]
