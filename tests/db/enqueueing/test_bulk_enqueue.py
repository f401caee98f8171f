"""Bulk enqueue (issue #12, decisions 115–119): ``enqueue_many`` and ``Task.delay_many``.

Every scenario runs on each database of the CI matrix (SQLite, PostgreSQL,
MariaDB): the bulk upsert (PostgreSQL, SQLite) and the lock-and-apply path
(MariaDB, and keys with a ``debounce_merge``) must leave exactly the rows that
the same calls made one at a time at the same instant leave.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings

from django_debounce import debounced_task, enqueue, enqueue_many, task
from django_debounce.enqueueing.bulk import Call
from django_debounce.exceptions import ConfigurationError, KeyResolutionError, PayloadError
from django_debounce.models import Job
from tests.conftest import T

pytestmark = pytest.mark.django_db

WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "b:{0}"}


@task(name="bulk.plain")
def plain(n, label=""):
    """A plain task."""


@debounced_task(name="bulk.window", **WINDOW)
def window(key, payload=None):
    """A debounced task keeping the first call's payload."""


@debounced_task(name="bulk.replace", debounce_replace_payload=True, **WINDOW)
def replace(key, payload=None):
    """A debounced task keeping the newest call's payload."""


def _union(stored, new):
    (key, ids), _kwargs = stored
    (_key, more), _ = new
    return [key, sorted(set(ids) | set(more))], {}


@debounced_task(name="bulk.merge", debounce_merge=_union, **WINDOW)
def merge(key, ids):
    """A debounced task whose window accumulates the union of ids (§4.8)."""


@task(name="bulk.unique", unique_key="u:{0}")
def unique(key):
    """A coalescing task (§6)."""


def rows() -> list[dict]:
    """Every job row, without its id, in a stable order."""
    found = [
        {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields if f.attname != "id"}
        for job in Job.objects.all()
    ]
    return sorted(found, key=lambda row: repr(sorted(row.items(), key=lambda kv: kv[0])))


#: A batch touching every kind of call: keys called several times, a call with a
#: shorter window, a payload-replacing call on a task that does not replace, merges,
#: coalescing calls and plain calls.
BATCH = [
    Call(window, ("a",), {"payload": 1}),
    Call(window, ("b",), {"payload": 1}),
    Call(plain, (1,)),
    Call(window, ("a",), {"payload": 2}),
    Call("bulk.replace", ("r",), {"payload": 1}),
    Call(window, ("a",), {"payload": 3}, {"debounce": "4s"}),
    Call(replace, ("r",), {"payload": 2}),
    Call(unique, ("x",)),
    Call(merge, ("m", [3, 1])),
    Call(window, ("c",), {"payload": 1}, {"debounce_replace_payload": True}),
    Call(merge, ("m", [2])),
    Call(unique, ("x",)),
    Call(window, ("c",), {"payload": 2}),
    Call(plain, (2,), {"label": "two"}, {"priority": 5, "queue": "mail"}),
    Call(window, ("b",), {"payload": 2}, {"debounce_replace_payload": True}),
    Call(window, ("c",), {"payload": 3}),
]


def _before(clock):
    """At T: open windows for ``a`` and ``m`` (one call each), then move to T+5."""
    window.delay("a", payload=0)
    merge.delay("m", [7])
    clock(seconds=5)


def _shape(jobs):
    """Outcomes, and which calls got the same job (by the first index holding its id)."""
    first: dict[int, int] = {}
    return [(job.outcome, first.setdefault(job.pk, i)) for i, job in enumerate(jobs)]


def test_a_batch_leaves_the_rows_of_the_same_calls_made_one_at_a_time(clock):
    _before(clock)
    one_by_one = [
        enqueue(
            c.task if isinstance(c.task, str) else c.task.name,
            c.args,
            c.kwargs,
            **(c.options or {}),
        )
        for c in BATCH
    ]
    expected_rows, expected_shape = rows(), _shape(one_by_one)
    Job.objects.all().delete()
    clock(seconds=0)
    _before(clock)

    jobs = enqueue_many(BATCH)

    assert rows() == expected_rows
    assert _shape(jobs) == expected_shape
    assert len(jobs) == len(BATCH)


def test_several_calls_of_one_key_give_exact_rows(clock):
    _before(clock)  # now T+5; 'a' opened at T with payload 0
    now = T + timedelta(seconds=5)
    jobs = enqueue_many(BATCH)

    a = Job.objects.get(task_name="bulk.window", debounce_key="b:a")
    assert (a.enqueue_count, a.opened_at, a.max_run_at) == (4, T, T + timedelta(seconds=60))
    assert a.run_at == now + timedelta(seconds=4)  # the last call's shorter window
    assert a.kwargs == {"payload": 0}  # the opener's payload stays
    assert [j.outcome for j in (jobs[0], jobs[3], jobs[5])] == ["debounced"] * 3
    assert {jobs[0].pk, jobs[3].pk, jobs[5].pk} == {a.pk}

    b = Job.objects.get(task_name="bulk.window", debounce_key="b:b")
    assert (b.enqueue_count, b.opened_at, b.run_at) == (2, now, now + timedelta(seconds=10))
    assert b.kwargs == {"payload": 2}  # the second call replaced it
    assert (jobs[1].outcome, jobs[14].outcome) == ("created", "debounced")

    c = Job.objects.get(task_name="bulk.window", debounce_key="b:c")
    assert c.enqueue_count == 3 and c.kwargs == {"payload": 1}  # only the opener replaced

    r = Job.objects.get(task_name="bulk.replace")
    assert (r.enqueue_count, r.kwargs) == (2, {"payload": 2})

    m = Job.objects.get(task_name="bulk.merge")
    assert (m.enqueue_count, m.args) == (3, ["m", [1, 2, 3, 7]])

    u = Job.objects.get(task_name="bulk.unique")
    assert (jobs[7].outcome, jobs[11].outcome, jobs[11].pk) == ("created", "coalesced", u.pk)

    p1, p2 = Job.objects.filter(task_name="bulk.plain").order_by("pk")
    assert (p1.args, p1.run_at, p1.queue, p1.priority) == ([1], now, "default", 0)
    assert (p2.args, p2.kwargs, p2.queue, p2.priority) == ([2], {"label": "two"}, "mail", 5)
    assert Job.objects.count() == 8


def test_delay_many_inserts_plain_calls_in_order(clock):
    jobs = plain.delay_many([(i,) for i in range(5)])
    assert [job.outcome for job in jobs] == ["created"] * 5
    assert [job.args for job in jobs] == [[i] for i in range(5)]
    stored = list(Job.objects.order_by("pk").values_list("pk", "args", "run_at", "status"))
    assert stored == [(job.pk, [i], T, "READY") for i, job in enumerate(jobs)]


def test_delay_many_on_one_hot_key(clock):
    jobs = window.delay_many([("hot", n) for n in range(50)])
    (job,) = Job.objects.all()
    assert (job.enqueue_count, job.args, job.run_at) == (50, ["hot", 0], T + timedelta(seconds=10))
    assert {j.pk for j in jobs} == {job.pk}
    assert [j.outcome for j in jobs] == ["created"] + ["debounced"] * 49
    clock(seconds=55)
    window.delay_many([("hot",)] * 3)
    job.refresh_from_db()
    assert (job.enqueue_count, job.run_at) == (53, T + timedelta(seconds=60))  # the ceiling


def test_more_calls_than_one_statement_carries(clock):
    """1,200 calls over 300 keys: more rows than one statement takes on SQLite (999 params)."""
    jobs = window.delay_many([(f"k{i % 300}",) for i in range(1200)])
    assert Job.objects.count() == 300
    assert set(Job.objects.values_list("enqueue_count", flat=True)) == {4}
    assert sum(j.outcome == "created" for j in jobs) == 300
    plain.delay_many([(i,) for i in range(1200)])
    assert Job.objects.filter(task_name="bulk.plain").count() == 1200


@pytest.mark.parametrize(
    ("bad", "error", "text"),
    [
        (Call(window, ({1, 2},)), KeyResolutionError, "enqueue_many: call [2]"),
        (Call(plain, (object(),)), PayloadError, "enqueue_many: call [2]: args[0] has type object"),
        (Call(plain, (1,), None, {"bogus": 1}), ConfigurationError, "unknown enqueue option"),
        (Call(window, ("k",), None, {"countdown": 5}), ConfigurationError, "countdown/eta"),
        (Call(plain, "1"), ConfigurationError, "args must be a tuple or list"),
        (("bulk.plain",), ConfigurationError, "give a Call"),
        (Call(42, ()), ConfigurationError, "the task must be a Task"),
    ],
)
def test_a_bad_call_names_its_index_and_writes_nothing(clock, bad, error, text):
    window.delay("k")
    before = rows()
    with pytest.raises(error) as caught:
        enqueue_many([Call(plain, (1,)), Call(window, ("k",)), bad, Call(plain, (3,))])
    assert text in str(caught.value)
    assert "[2]" in str(caught.value)
    assert rows() == before


def test_an_expired_window_is_ended_and_a_new_one_opens(clock):
    old = window.apply_async(("e",), expires=T + timedelta(seconds=61))
    clock(seconds=62)
    jobs = window.delay_many([("e",), ("e",)])
    old.refresh_from_db()
    assert old.status == Job.Status.EXPIRED and old.enqueue_count == 1
    new = Job.objects.get(status=Job.Status.READY)
    assert (new.enqueue_count, new.opened_at) == (2, T + timedelta(seconds=62))
    assert [j.outcome for j in jobs] == ["created", "debounced"]


def test_the_batch_rolls_back_with_the_callers_transaction(clock):
    with pytest.raises(RuntimeError), transaction.atomic():
        window.delay_many([("x",), ("y",)])
        plain.delay_many([(1,)])
        assert Job.objects.count() == 3
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0


def test_one_signal_per_call_and_nothing_for_an_empty_batch(clock, signal_log):
    assert enqueue_many([]) == []
    window.delay_many([("s",), ("s",)])
    assert [(name, kw["outcome"]) for name, kw, _status in signal_log] == [
        ("job_enqueued", "created"),
        ("job_enqueued", "debounced"),
    ]


def test_refused_without_use_tz():
    with override_settings(USE_TZ=False), pytest.raises(ConfigurationError, match="USE_TZ"):
        plain.delay_many([(1,)])
    assert Job.objects.count() == 0
