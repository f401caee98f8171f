"""Rate limits per debounce key (``rate_limit_per_key=``, decision 189; §6) under a controlled clock.

Every test drives the real claim (``claim_jobs``) with the clock frozen at T,
so the per-key buckets refill at exact instants: the same exactness the
task-wide bucket's tests (``test_flow_control.py``) ask of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from django_debounce import registry, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError
from django_debounce.flow import hold_reasons, redis_buckets
from django_debounce.flow.key_rates import PRUNE_BATCH, prune_full
from django_debounce.flow.redis_buckets import Level
from django_debounce.flow.redis_key_buckets import key_store, scoped
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job, KeyBucket
from django_debounce.ops.status import collect_status, render_status
from django_debounce.run.outcomes import record_success
from django_debounce.worker.deadlines import next_refill_at
from tests.conftest import T
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis
from tests.testapp.models import CallLog

pytestmark = pytest.mark.django_db

LEASE = dt.timedelta(seconds=60)
S = dt.timedelta(seconds=1)
READY, RUNNING, SHED = Job.Status.READY, Job.Status.RUNNING, Job.Status.SHED


def _log(customer: str, n: int) -> None:
    CallLog.objects.create(task="kr", key=f"{customer}:{n}", started_at=timezone.now())


@pytest.fixture
def keyed() -> Iterator[dict[str, Any]]:
    """A defer-mode and a drop-mode task: 3 runs per minute per customer (the first argument)."""
    options = {
        "debounce": "1s",
        "debounce_max_wait": "1h",
        "debounce_key": "{0}",
        "rate_limit_per_key": "3/m",
    }
    tasks = {
        "defer": task(name="kr.defer", **options)(_log),
        "drop": task(name="kr.drop", on_excess="drop", **options)(_log),
    }
    yield tasks
    for created in tasks.values():
        registry.unregister(created.name)


def claim_and_finish(limit: int = 50, **options: Any) -> list[tuple[str, int]]:
    """Claim like a worker with ``limit`` free threads, finish every job at once; return (key, n)."""
    jobs = claim_jobs(worker_id="w", limit=limit, lease=LEASE, **options)
    for job in jobs:
        record_success(job, None, worker_id="w", using="default")
    return sorted((job.args[0], job.args[1]) for job in jobs)


def call_then_claim(clock, created, at: float, n: int, keys=("acme", "bolt")):
    """Call ``created`` for each key at ``at`` s, then claim when the 1 s windows close."""
    clock(seconds=at)
    for key in keys:
        created.delay(key, n)
    clock(seconds=at + 1)
    return claim_and_finish()


def bucket(task_name: str, key: str) -> KeyBucket:
    job = Job.objects.filter(task_name=task_name, debounce_key=key).first()
    assert job is not None
    return KeyBucket.objects.get(task_name=task_name, key_hash=job.key_hash)


def test_each_key_has_its_own_bucket_and_refills_exactly(clock, keyed):
    created = keyed["defer"]
    assert call_then_claim(clock, created, 0, 0) == [("acme", 0), ("bolt", 0)]
    assert call_then_claim(clock, created, 1, 1) == [("acme", 1), ("bolt", 1)]
    assert call_then_claim(clock, created, 2, 2, keys=("acme",)) == [("acme", 2)]
    # 3/m: capacity 3, a token every 20 s; takes at 1 s, 2 s and 3 s leave 3 - 3 + 2/20.
    row = bucket("kr.defer", "acme")
    assert row.tokens == pytest.approx(0.1) and row.tokens_at == T + 3 * S
    assert row.blocked_until is not None
    assert (row.blocked_until - T).total_seconds() == pytest.approx(21, abs=1e-5)
    assert (row.full_at - T).total_seconds() == pytest.approx(61, abs=1e-5)
    assert call_then_claim(clock, created, 3, 3) == [("bolt", 3)]  # acme waits; bolt: 1.15 tokens
    (waiting,) = Job.objects.filter(task_name="kr.defer", status=READY)
    assert waiting.args == ["acme", 3]
    until = row.blocked_until
    clock(at=until - dt.timedelta(milliseconds=1))
    assert claim_and_finish() == []
    clock(at=until)
    assert claim_and_finish() == [("acme", 3)]
    assert DeadLetter.objects.count() == 0


def test_drop_sheds_beyond_the_key_bucket_with_a_dead_letter(clock, keyed):
    created = keyed["drop"]
    for n in range(3):
        assert call_then_claim(clock, created, n, n) == [("acme", n), ("bolt", n)]
    assert call_then_claim(clock, created, 3, 3, keys=("acme",)) == []  # shed, not held
    (shed,) = Job.objects.filter(task_name="kr.drop", status=SHED)
    assert (shed.args, shed.finished_at) == (["acme", 3], T + 4 * S)
    (letter,) = DeadLetter.objects.filter(job=shed)
    assert (letter.reason, letter.kind) == ("shed: rate limit per key 3/m exceeded", "shed")
    assert letter.metadata == {"shed": True, "rate_limit_per_key": "3/m", "capacity": 3}
    assert KeyBucket.objects.filter(task_name="kr.drop", blocked_until__isnull=False).count() == 0
    # 20 s after the first take of the minute a token is back for each key.
    assert call_then_claim(clock, created, 20, 4, keys=("acme",)) == [("acme", 4)]


def test_the_held_job_says_why_and_until_when(clock, keyed):
    created = keyed["defer"]
    for n in range(3):
        call_then_claim(clock, created, n, n, keys=("acme",))
    clock(seconds=3)
    job = created.delay("acme", 3)
    clock(seconds=4)
    assert claim_and_finish() == []
    holds = hold_reasons.held_back(Job.objects.get(pk=job.pk))
    assert [hold.code for hold in holds] == ["key_rate_limit"]
    assert holds[0].until is not None
    assert (holds[0].until - T).total_seconds() == pytest.approx(21, abs=1e-5)
    assert "rate limit per key 3/m" in holds[0].text
    # The admin's "Run now" message names the rule that still applies at the claim.
    note = hold_reasons.flow_control_notes(["kr.defer"])["kr.defer"]
    assert note == "has a rate limit per key of 3/m, applied when a worker claims it"


def test_a_call_without_a_key_is_not_limited_per_key(clock):
    def key_or_none(customer: str, n: int) -> str | None:
        return customer or None

    created = task(
        name="kr.optional",
        debounce="1s",
        debounce_max_wait="1h",
        debounce_key=key_or_none,
        rate_limit_per_key="1/h",
    )(_log)
    try:
        for n in range(3):
            assert call_then_claim(clock, created, n, n, keys=("", "acme")) == [
                ("", n),
                *([("acme", 0)] if n == 0 else []),
            ]
    finally:
        registry.unregister("kr.optional")


def test_waiting_keys_do_not_starve_other_jobs(clock, keyed):
    plain = task(name="kr.plain")(_log)
    try:
        created = keyed["defer"]
        customers = [f"c{i:02}" for i in range(40)]
        for n in range(3):
            assert len(call_then_claim(clock, created, n, n, keys=customers)) == 40
        clock(seconds=3)
        for key in customers:
            created.delay(key, 3)
        clock(seconds=4)
        plain.delay("p", 0)  # due after the 40 waiting jobs
        assert claim_and_finish(limit=1) == [("p", 0)]
        assert Job.objects.filter(task_name="kr.defer", status=READY).count() == 40
    finally:
        registry.unregister("kr.plain")


@pytest.fixture(params=["database", "redis"])
def task_store(request, settings) -> Iterator[str]:
    """The buckets in the database, or in Redis (the task-wide and the per-key ones, decision 193)."""
    if request.param == "database":
        yield "database"
        return
    require_redis()
    settings.DEBOUNCE_REDIS = "redis"
    assert redis_buckets.store() is not None
    yield "redis"
    delete_test_keys(cache_url(), key_prefix())


def test_a_refusal_per_key_takes_no_task_wide_token(clock, task_store):
    created = task(
        name="kr.both",
        debounce="1s",
        debounce_max_wait="1h",
        debounce_key="{0}",
        rate_limit="2/h",
        rate_limit_per_key="1/h",
    )(_log)
    try:
        assert call_then_claim(clock, created, 0, 0, keys=("acme",)) == [("acme", 0)]
        assert call_then_claim(clock, created, 1, 1, keys=("acme",)) == []  # the key's bucket
        assert call_then_claim(clock, created, 2, 2, keys=("bolt",)) == [("bolt", 2)]
        assert call_then_claim(clock, created, 3, 3, keys=("cara",)) == []  # the task's bucket
        # The rows of acme and bolt, waiting for a token. In the database, cara's, made full
        # and never taken from, is pruned; in Redis, its bucket was never touched (the task's
        # empty bucket kept the job out of the claim's candidates).
        assert KeyBucket.objects.filter(task_name="kr.both").count() == 2
        if task_store == "redis":
            cara = Job.objects.get(task_name="kr.both", debounce_key="cara").key_hash
            name = scoped(("kr.both", cara))
            assert key_store().levels({name: bucket_for("1/h")})[name] == Level(None, None)
    finally:
        registry.unregister("kr.both")


def test_a_keyed_job_is_never_claimed_ahead_of_a_free_thread(clock, keyed):
    for key in ("a", "b", "c"):
        keyed["defer"].delay(key, 0)
    clock(seconds=1)
    jobs = claim_jobs(worker_id="w", limit=3, lease=LEASE, start_now=1)
    assert len(jobs) == 1  # judged at its start (decision 146): one thread free, one job


def test_full_buckets_are_pruned_and_prune_is_bounded(clock, keyed):
    created = keyed["defer"]
    call_then_claim(clock, created, 0, 0, keys=[f"c{i}" for i in range(5)])
    assert KeyBucket.objects.filter(task_name="kr.defer").count() == 5
    clock(seconds=1 + 20)  # one take of 3: full again 20 s later
    created.delay("other", 0)
    clock(seconds=22)
    assert claim_and_finish() == [("other", 0)]
    # The claim deleted the five full rows; only the bucket it took from is left.
    assert KeyBucket.objects.filter(task_name="kr.defer").count() == 1
    KeyBucket.objects.bulk_create(
        [
            KeyBucket(task_name="kr.x", key_hash=f"{i:064}", tokens=1, tokens_at=T, full_at=T)
            for i in range(PRUNE_BATCH + 5)
        ]
    )
    assert prune_full(T + 22 * S, using="default") == PRUNE_BATCH
    assert prune_full(T + 22 * S, using="default") == 5
    assert KeyBucket.objects.filter(task_name="kr.x").count() == 0


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rate_limit_per_key": "3/m"}, "declare debounce_key= too"),
        (
            {
                "debounce": "1s",
                "debounce_max_wait": "1h",
                "debounce_key": "{0}",
                "rate_limit_per_key": "3/fortnight",
            },
            "rate_limit_per_key='3/fortnight' is not a rate",
        ),
        (
            {
                "debounce": "1s",
                "debounce_max_wait": "1h",
                "debounce_key": "{0}",
                "rate_limit_per_key": 3,
            },
            "must be a str 'N/period'",
        ),
    ],
)
def test_bad_declarations_are_refused(options, match):
    with pytest.raises(ConfigurationError, match=match):
        task(name="kr.bad", **options)(_log)
    assert registry.lookup("kr.bad") is None


def test_status_and_admin_show_the_rule_and_counts_not_the_keys(clock, keyed, admin_client):
    created = keyed["defer"]
    for n in range(3):
        call_then_claim(clock, created, n, n)
    clock(seconds=3)
    created.delay("acme", 3)
    clock(seconds=4)
    claim_and_finish()

    (row,) = [r for r in collect_status()["per_key"] if r["task_name"] == "kr.defer"]
    assert row == {
        "task_name": "kr.defer",
        "rate_limit_per_key": "3/m",
        "on_excess": "defer",
        "keys_in_use": 2,
        "keys_waiting": 2,  # both keys took 3 tokens: bolt waits too, with no job
    }
    text = render_status(collect_status(), width=100)
    assert "rate limits per key (keys in use, waiting)" in text
    (line,) = [t for t in text.splitlines() if "kr.defer" in t]
    assert line.endswith("3/m      2 in use      2 waiting") and len(line) <= 100  # not cut
    page = admin_client.get("/admin/django_debounce/taskstate/").content.decode()
    assert "3/m per key · 2 keys in use, 2 waiting for a token" in page
    assert "acme" not in page
    change = admin_client.get("/admin/django_debounce/taskstate/kr.defer/change/")
    assert "3/m per key · 2 keys in use, 2 waiting for a token" in change.content.decode()


def test_an_idle_worker_wakes_at_a_waiting_keys_next_token(clock, keyed):
    created = keyed["defer"]
    for n in range(3):
        call_then_claim(clock, created, n, n, keys=("acme",))
    until = bucket("kr.defer", "acme").blocked_until
    assert until is not None
    now = clock(seconds=4)
    assert next_refill_at(now, free=1) == until
    assert next_refill_at(until, free=1, since=until) is None  # that claim saw the token
