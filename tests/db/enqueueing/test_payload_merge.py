"""Payload merges (§4.8): ``debounce_merge(stored_call, new_call) -> call_to_store``.

The racing-producer proof is in ``processes/test_coalescing_races.py`` (PostgreSQL, real
processes); this module pins the single-process semantics: what the function
receives, when it runs, and that a merge which fails changes nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction

from django_debounce import debounced_task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError, PayloadError
from django_debounce.models import Job
from tests.conftest import T

pytestmark = pytest.mark.django_db

MERGES: list[tuple[tuple, tuple]] = []
RUNS: list[tuple] = []


@pytest.fixture(autouse=True)
def _reset():
    MERGES.clear()
    RUNS.clear()
    yield
    MERGES.clear()
    RUNS.clear()


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def snapshot(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def add_refs(stored, new):
    MERGES.append((stored, new))
    (key, refs), _ = stored
    (_, more), kwargs = new
    if kwargs.get("explode"):
        raise LookupError("merge failed")
    if kwargs.get("shape"):
        return "not a call"
    if kwargs.get("unstorable"):
        return [key, {1, 2}], {}
    return [key, refs + [r for r in more if r not in refs]], {}


WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "m:{0}"}


@debounced_task(name="merge.refs", debounce_merge=add_refs, **WINDOW)
def refs(key, items, **flags):
    RUNS.append(("refs", key, items))


@debounced_task(name="merge.plain", **WINDOW)
def plain(key, items, **flags):
    RUNS.append(("plain", key, items))


def test_merge_receives_decoded_calls_and_runs_once_per_slide(clock, burst):
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = refs.delay("k", [ref])
    assert MERGES == []  # the call that opens the window is stored as given
    clock(seconds=2)
    second = refs.delay("k", [Decimal("1.50"), when])
    assert MERGES == [((["k", [ref]], {}), (["k", [Decimal("1.50"), when]], {}))]
    clock(seconds=4)
    third = refs.delay("k", [ref, "x"])
    assert len(MERGES) == 2 and MERGES[1][0] == (["k", [ref, Decimal("1.50"), when]], {})
    assert [j.outcome for j in (first, second, third)] == ["created", "debounced", "debounced"]
    row = fresh(first)
    assert (row.enqueue_count, row.run_at) == (3, T + timedelta(seconds=14))
    clock(seconds=14)
    burst()
    assert RUNS == [("refs", "k", [ref, Decimal("1.50"), when, "x"])]


@pytest.mark.parametrize(
    ("flag", "error", "match"),
    [
        ("explode", LookupError, "merge failed"),
        ("shape", ConfigurationError, "must return"),
        ("unstorable", PayloadError, "set"),
    ],
)
def test_a_failing_merge_changes_nothing_and_keeps_the_transaction(clock, flag, error, match):
    first = refs.delay("k", [1])
    clock(seconds=3)
    refs.delay("k", [2])
    before = snapshot(fresh(first))
    clock(seconds=5)
    with transaction.atomic():
        with pytest.raises(error, match=match):
            refs.apply_async(("k", [3]), {flag: True})
        assert Job.objects.count() == 1  # the caller's transaction is still usable
    assert snapshot(fresh(first)) == before
    assert fresh(first).args == ["k", [1, 2]]


def test_per_call_merge_on_a_task_without_one(clock):
    def keep_longest(stored, new):
        return max(stored, new, key=lambda call: len(call[0][1]))

    first = plain.apply_async(("k", [1, 2]), debounce_merge=keep_longest)
    plain.apply_async(("k", [9]), debounce_merge=keep_longest)
    assert fresh(first).args == ["k", [1, 2]]
    plain.apply_async(("k", [7, 8, 9]), debounce_merge=keep_longest)
    plain.delay("k", [5])  # no merge on this call: the stored call stays
    row = fresh(first)
    assert (row.args, row.enqueue_count) == (["k", [7, 8, 9]], 4)


def test_a_claimed_window_is_never_merged_into(clock):
    first = refs.delay("k", [1])
    clock(seconds=10)
    (claimed,) = claim_jobs(worker_id="w", limit=1, lease=timedelta(minutes=1))
    assert claimed.pk == first.pk
    again = refs.delay("k", [2])
    assert (again.outcome, again.args, again.run_at) == (
        "created",
        ["k", [2]],
        T + timedelta(seconds=20),
    )
    assert MERGES == []
    assert fresh(first).args == ["k", [1]]
