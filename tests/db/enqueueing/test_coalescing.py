"""Coalescing semantics (§1, §6): what ``unique_key``/``idempotent=True`` return, and when.

Complements ``db/test_enqueue.py`` (READY and RUNNING coalescing, a new job after
SUCCESSFUL, idempotent binding, per-call templates, debounce + unique key per
call), ``db/test_task_registration.py`` (debounce + unique key at decoration) and
``processes/test_coalescing_races.py`` (racing producer processes on PostgreSQL).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest

from django_debounce import enqueue, task
from django_debounce.exceptions import ConfigurationError, KeyResolutionError
from django_debounce.models import DeadLetter, Job
from tests.conftest import T

pytestmark = pytest.mark.django_db

RUNS: list[tuple[str, tuple, dict]] = []
FAIL: set[str] = set()


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()
    FAIL.clear()
    yield
    RUNS.clear()
    FAIL.clear()


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def snapshot(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@task(name="coal.t.pay", unique_key="pay:{account}:{currency}", max_retries=1)
def pay(account, amount, currency="EUR"):
    RUNS.append(("pay", (account, amount, currency), {}))
    if account in FAIL:
        raise RuntimeError(f"declined {account}")


def _order_key(order_id, *lines, rush=False):
    return None if rush else f"order:{order_id}"


@task(name="coal.t.ship", unique_key=_order_key)
def ship(order_id, *lines, rush=False):
    RUNS.append(("ship", (order_id, *lines), {"rush": rush}))


@task(name="coal.t.sync", idempotent=True)
def sync(ref, items=(), *, full=False, **extra):
    RUNS.append(("sync", (ref, items), {"full": full, **extra}))


@task(name="coal.t.sync_twin", idempotent=True)
def sync_twin(ref, items=(), *, full=False, **extra):
    RUNS.append(("sync_twin", (ref, items), {"full": full, **extra}))


@task(name="coal.t.plain")
def plain(*args, **kwargs):
    RUNS.append(("plain", args, kwargs))


@task(name="coal.t.expiring", unique_key="exp:{0}", expires="30s")
def expiring(ref):
    RUNS.append(("expiring", (ref,), {}))


# -- templates bind through the signature (§3) ------------------------------------------------


def test_unique_template_binds_positional_keyword_and_defaults(clock):
    first = pay.delay("acct", 10)
    assert (first.outcome, first.unique_key) == ("created", "pay:acct:EUR")
    same = [
        pay.delay(account="acct", amount=20),
        pay.delay("acct", 30, "EUR"),
        pay.delay("acct", amount=40, currency="EUR"),
        pay.apply_async(kwargs={"amount": 50, "account": "acct"}),
    ]
    assert [(j.outcome, j.pk) for j in same] == [("coalesced", first.pk)] * 4
    other = pay.delay("acct", 10, currency="USD")
    assert (other.outcome, other.unique_key) == ("created", "pay:acct:USD")
    assert Job.objects.count() == 2
    assert fresh(first).args == ["acct", 10]  # the first call's payload, untouched


def test_coalesced_call_returns_the_row_unchanged_with_its_deadline(clock):
    first = pay.apply_async(("acct", 1), countdown=60, priority=5, notes="first")
    before = snapshot(fresh(first))
    clock(seconds=30)
    again = pay.apply_async(("acct", 2), countdown=5, priority=-5, notes="second", queue="other")
    assert (again.outcome, again.pk, again.run_at) == (
        "coalesced",
        first.pk,
        T + timedelta(seconds=60),
    )
    assert snapshot(again) == before == snapshot(fresh(first))  # nothing moves, not even the count
    assert (again.enqueue_count, again.priority, again.queue, again.notes) == (
        1,
        5,
        "default",
        "first",
    )


# -- unique_key callables (§3 rules, on the task and per call) --------------------------------


def test_unique_key_callable_on_the_task_and_none_opts_out(clock):
    first = ship.delay(7, "a", "b")
    assert (first.outcome, first.unique_key) == ("created", "order:7")
    again = ship.delay(7, "c")
    assert (again.outcome, again.pk) == ("coalesced", first.pk)
    # The callable returned None: no coalescing for this call, a plain job.
    rush = [ship.delay(7, "x", rush=True), ship.delay(7, "y", rush=True)]
    assert [j.outcome for j in rush] == ["created", "created"]
    assert [j.unique_key for j in rush] == [None, None]
    assert Job.objects.count() == 3


def test_unique_key_callable_per_call_and_its_errors(clock):
    def by_first(*args, **kwargs):
        return f"first:{args[0]}"

    first = plain.apply_async((1, "x"), unique_key=by_first)
    again = plain.apply_async((1, "y"), unique_key=by_first)
    assert [(j.outcome, j.unique_key) for j in (first, again)] == [
        ("created", "first:1"),
        ("coalesced", "first:1"),
    ]
    assert again.pk == first.pk
    with pytest.raises(KeyResolutionError):
        plain.apply_async((2,), unique_key=lambda *a: 12)  # a key must be a str
    with pytest.raises(KeyResolutionError, match="4096"):
        plain.apply_async((2,), unique_key=lambda *a: "x" * 4097)
    assert Job.objects.count() == 1


def test_debounce_with_a_unique_key_callable_per_call_writes_nothing(
    clock, django_assert_num_queries
):
    with django_assert_num_queries(0), pytest.raises(ConfigurationError, match="§1"):
        plain.apply_async((1,), debounce="10s", debounce_max_wait="1m", unique_key=lambda *a: "u")
    with django_assert_num_queries(0), pytest.raises(ConfigurationError, match="§1"):
        sync.apply_async(("r",), debounce="10s", debounce_max_wait="1m")
    assert Job.objects.count() == 0


# -- idempotent=True: the hash of the task name and the canonical arguments (§6) ---------------


def test_idempotent_hash_is_canonical_over_binding_and_kwargs_order(clock):
    first = sync.delay("r1", [1, 2], full=True, a=1, b=2)
    same = [
        sync.delay("r1", [1, 2], b=2, a=1, full=True),
        sync.delay(ref="r1", items=[1, 2], full=True, b=2, a=1),
        sync.delay("r1", (1, 2), full=True, a=1, b=2),  # a tuple is stored as a list (§5)
        sync.apply_async(args=["r1"], kwargs={"b": 2, "items": [1, 2], "a": 1, "full": True}),
    ]
    assert [(j.outcome, j.pk) for j in same] == [("coalesced", first.pk)] * 4
    assert sync.delay("r1").pk == sync.delay("r1", (), full=False).pk != first.pk  # defaults bind
    different = [
        sync.delay("r1", [2, 1], full=True, a=1, b=2),  # list order is part of the call
        sync.delay("r1", [1, 2], full=True, a=1, b=3),
        sync.delay("r1", [1, 2], full=True, a=1, b=2, c=None),
        sync.delay("r1", [1, 2], full=False, a=1, b=2),
    ]
    assert [j.outcome for j in different] == ["created"] * 4
    assert Job.objects.count() == 6
    assert first.unique_key.startswith("args:")


def test_idempotent_hash_uses_the_codec_form(clock):
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    a = sync.delay(ref)
    assert sync.delay(ref).pk == a.pk
    # The codec stores a UUID and its string differently, and Decimal("1.0") and
    # Decimal("1.00") are different values to it: different calls, different jobs.
    assert sync.delay(str(ref)).pk != a.pk
    assert sync.delay(Decimal("1.0")).pk != sync.delay(Decimal("1.00")).pk
    assert sync.delay(Decimal("1.0")).outcome == "coalesced"


def test_idempotent_hash_includes_the_task_name(clock):
    a, b = sync.delay("r", [1]), sync_twin.delay("r", [1])
    assert (a.outcome, b.outcome) == ("created", "created")
    assert a.unique_key == b.unique_key  # the same argument hash ...
    assert a.pk != b.pk  # ... but the lock is per task name (§3: two tasks never share)


def test_enqueue_by_name_coalesces_with_the_decorated_task(clock):
    first = sync.delay("r", [1])
    again = enqueue("coal.t.sync", args=("r", [1]))
    assert (again.outcome, again.pk) == ("coalesced", first.pk)


# -- READY, RUNNING, then finished: when a new job may be created ------------------------------


def test_a_job_waiting_for_its_retry_is_still_pending(clock, burst):
    FAIL.add("acct")
    first = pay.delay("acct", 1)
    burst()
    waiting = fresh(first)
    assert (waiting.status, waiting.attempts) == (Job.Status.READY, 1)
    again = pay.delay("acct", 2)
    assert (again.outcome, again.pk, again.run_at) == ("coalesced", first.pk, waiting.run_at)


def test_after_failed_for_good_a_new_job_is_created(clock, burst):
    FAIL.add("acct")
    first = pay.delay("acct", 1)
    burst()
    clock(hours=1)
    burst()  # the retry fails too: max_retries=1, so FAILED with a dead letter
    assert fresh(first).status == Job.Status.FAILED
    assert DeadLetter.objects.filter(job=first).count() == 1
    FAIL.clear()
    again = pay.delay("acct", 2)
    assert again.outcome == "created" and again.pk != first.pk
    assert pay.delay("acct", 3).pk == again.pk
    burst()
    assert fresh(again).status == Job.Status.SUCCESSFUL
    assert RUNS[-1] == ("pay", ("acct", 2, "EUR"), {})


def test_after_expiry_a_new_job_is_created(clock, burst):
    first = expiring.apply_async(("r",), countdown=10)  # due at T+10 s, expires at T+30 s
    assert expiring.delay("r").pk == first.pk
    clock(seconds=31)
    burst()  # claimed after its expiry: EXPIRED, never runs
    assert fresh(first).status == Job.Status.EXPIRED
    assert RUNS == []
    again = expiring.delay("r")
    assert again.outcome == "created" and again.pk != first.pk


def test_a_calls_unique_key_overrides_the_tasks(clock):
    hashed = sync.delay("r", [1])
    keyed = sync.apply_async(("r", [2]), unique_key="sync:{ref}")
    assert (keyed.outcome, keyed.unique_key) == ("created", "sync:r")
    assert sync.apply_async(("r", [3]), unique_key="sync:{ref}").pk == keyed.pk
    assert sync.delay("r", [1]).pk == hashed.pk != keyed.pk
    assert pay.apply_async(("acct", 1), unique_key="any:{0}").unique_key == "any:acct"
