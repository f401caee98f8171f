"""Field reports about declaring and enqueueing (B01 B04 B05 B06 B08 B09 B10).

Each test follows its entry in ``../shared/cases/field-reports.md`` (relative to the
repository root); "run@t" is ``clock(...)`` then ``burst()``. B12 lives in ``db/test_debounce_keys.py`` and B13 in
``db/test_payload_codec.py``, beside the behaviour they pin down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import transaction

from django_debounce import debounced_task, task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.exceptions import ConfigurationError, KeyResolutionError
from django_debounce.models import Job
from tests.conftest import T, child_env
from tests.testapp.models import Order

#: (task label, args, kwargs) of every run; runs are inline under ``--burst``.
RAN: list[tuple[str, tuple, dict]] = []


@pytest.fixture(autouse=True)
def _clear_ran():
    RAN.clear()
    yield
    RAN.clear()


def m(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def sec(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def snapshot(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def ready_rows(task_obj, key: str) -> int:
    return Job.objects.ready().filter(task_name=task_obj.name, debounce_key=key).count()


def window(label: str, debounce: str, max_wait: str | None, key, **options):
    """``@debounced_task`` named ``enq.fr.<label>``: [debounce / max_wait / key]."""
    return debounced_task(
        name=f"enq.fr.{label}",
        debounce=debounce,
        debounce_max_wait=max_wait,
        debounce_key=key,
        **options,
    )


# -- B01 ----------------------------------------------------------------------------------------


@window("notify", "10m", "1h", "notify:{user_id}")
def notify(user_id, version):
    RAN.append(("notify", (user_id, version), {}))


@window("notify_replace", "10m", "1h", "notify:{user_id}", debounce_replace_payload=True)
def notify_replace(user_id, version):
    RAN.append(("notify_replace", (user_id, version), {}))


@pytest.mark.django_db
def test_b01_trailing_debounce_runs_once(clock, burst):
    variants = {  # label: (task, user, the T+3m call)
        "notify": (notify, 7, lambda: notify.delay(7, "v2")),
        "notify_replace": (notify_replace, 7, lambda: notify_replace.delay(7, "v2")),
        "per_call": (notify, 8, lambda: notify.apply_async((8, "v2"), debounce_replace_payload=True)),
    }  # fmt: skip
    calls = {label: [] for label in variants}
    for t, version in ((0, "v1"), (3, "v2"), (6, "v3")):
        clock(minutes=t)
        for label, (task_obj, user, at_3m) in variants.items():
            job = at_3m() if t == 3 else task_obj.delay(user, version)
            calls[label].append(job)
            row = fresh(job)
            assert (row.run_at, row.opened_at, row.max_run_at) == (m(t + 10), T, m(60))
            assert ready_rows(task_obj, f"notify:{user}") == 1
    for jobs in calls.values():
        assert [j.outcome for j in jobs] == ["created", "debounced", "debounced"]
        assert len({j.pk for j in jobs}) == 1
        row = fresh(jobs[0])
        assert (row.enqueue_count, row.last_enqueued_at) == (3, m(6))
    clock(minutes=15, seconds=59)
    burst()
    assert RAN == []
    clock(minutes=16)
    burst()
    assert sorted(RAN) == [
        ("notify", (7, "v1"), {}),
        ("notify", (8, "v2"), {}),
        ("notify_replace", (7, "v3"), {}),
    ]
    assert {fresh(j[0]).status for j in calls.values()} == {Job.Status.SUCCESSFUL}


# -- B04 ----------------------------------------------------------------------------------------


def append_assignments(stored, new):
    (stored_args, stored_kwargs), (new_args, _) = stored, new
    return [stored_args[0], stored_args[1] + new_args[1]], stored_kwargs


@window("digest", "10m", "1h", "digest:{student_id}")
def digest(student_id, assignments):
    RAN.append(("digest", (student_id, assignments), {}))


@window("digest_replace", "10m", "1h", "digest:{student_id}", debounce_replace_payload=True)
def digest_replace(student_id, assignments):
    RAN.append(("digest_replace", (student_id, assignments), {}))


@window("digest_merge", "10m", "1h", "digest:{student_id}", debounce_merge=append_assignments)
def digest_merge(student_id, assignments):
    RAN.append(("digest_merge", (student_id, assignments), {}))


@pytest.mark.django_db
def test_b04_same_instant_burst_is_one_job(clock, burst):
    for task_obj in (digest, digest_replace, digest_merge):
        jobs = [task_obj.delay(7, [i]) for i in range(1, 11)]
        assert all(isinstance(j, Job) for j in jobs)
        assert [j.outcome for j in jobs] == ["created"] + ["debounced"] * 9
        assert len({j.pk for j in jobs}) == 1
        assert ready_rows(task_obj, "digest:7") == 1
        row = fresh(jobs[0])
        assert (row.run_at, row.opened_at, row.enqueue_count) == (m(10), T, 10)
    assert fresh(jobs[0]).args == [7, list(range(1, 11))]  # merged inside the locked step
    clock(minutes=9, seconds=59)
    burst()
    assert RAN == []
    clock(minutes=10)
    burst()
    assert sorted(RAN) == [
        ("digest", (7, [1]), {}),
        ("digest_merge", (7, list(range(1, 11))), {}),
        ("digest_replace", (7, [10]), {}),
    ]
    with pytest.raises(ConfigurationError, match="debounce_merge"):

        @window("digest_both", "10m", "1h", "d:{0}", debounce_merge=append_assignments, debounce_replace_payload=True)  # fmt: skip
        def digest_both(student_id, assignments):
            pass


# -- B05 ----------------------------------------------------------------------------------------


@window("process_a", "2m", "10m", "article:{article_id}", debounce_replace_payload=True)
def process_a(article_id, version):
    RAN.append(("process_a", (article_id, version), {}))


@window("process_a_keep", "2m", "10m", "article:{article_id}")
def process_a_keep(article_id, version):
    RAN.append(("process_a_keep", (article_id, version), {}))


@task(name="enq.fr.process_b", unique_key="article:{article_id}")
def process_b(article_id, version):
    RAN.append(("process_b", (article_id, version), {}))


@pytest.mark.django_db
def test_b05_debounce_replace_vs_unique_key(clock):
    with pytest.raises(ConfigurationError):
        process_a.apply_async(args=(42, "v4"), unique_key="x")
    with pytest.raises(ConfigurationError):

        @window("b05_both", "2m", "10m", "article:{article_id}", unique_key="article:{article_id}")
        def process_both(article_id, version):
            pass

    assert Job.objects.count() == 0

    a1, k1, b1 = (
        process_a.delay(42, "v1"),
        process_a_keep.delay(42, "v1"),
        process_b.delay(42, "v1"),
    )
    clock(minutes=1)
    a2, k2, b2 = (
        process_a.delay(42, "v2"),
        process_a_keep.delay(42, "v2"),
        process_b.delay(42, "v2"),
    )
    assert (a2.pk, a2.outcome, k2.pk) == (a1.pk, "debounced", k1.pk)
    assert ready_rows(process_a, "article:42") == 1
    assert (fresh(a1).args, fresh(a1).run_at) == ([42, "v2"], m(3))
    assert (fresh(k1).args, fresh(k1).run_at) == ([42, "v1"], m(3))
    b_rows = Job.objects.filter(task_name=process_b.name)
    assert [(r.status, r.args, r.run_at) for r in b_rows] == [(Job.Status.READY, [42, "v1"], T)]
    assert (b2.outcome, b2.pk, b2.run_at) == ("coalesced", b1.pk, T)

    # B is due since T: claim it at T+1m, and call while it runs.
    assert [j.pk for j in claim_jobs(worker_id="w-b", limit=10, lease=timedelta(minutes=5))] == [
        b1.pk
    ]
    b3 = process_b.delay(42, "v3")
    assert (b3.outcome, b3.pk, b3.status, b3.args) == (
        "coalesced",
        b1.pk,
        Job.Status.RUNNING,
        [42, "v1"],
    )
    assert b_rows.count() == 1

    clock(minutes=3)
    claimed = claim_jobs(worker_id="w-a", limit=10, lease=timedelta(minutes=5))
    assert {j.pk for j in claimed} == {a1.pk, k1.pk}
    running = snapshot(fresh(a1))
    a3 = process_a.delay(42, "v3")
    assert (a3.outcome, a3.args, a3.opened_at, a3.run_at) == ("created", [42, "v3"], m(3), m(5))
    assert a3.pk != a1.pk
    assert snapshot(fresh(a1)) == running
    assert (running["status"], running["args"]) == (Job.Status.RUNNING, [42, "v2"])


# -- B06 ----------------------------------------------------------------------------------------


@window("summarize", "5m", "30m", "sum:{conv_id}")
def summarize(conv_id, msg):
    RAN.append(("summarize", (conv_id,), {"msg": msg}))


@window("summarize_replace", "5m", "30m", "sum:{conv_id}", debounce_replace_payload=True)
def summarize_replace(conv_id, msg):
    RAN.append(("summarize_replace", (conv_id,), {"msg": msg}))


@pytest.mark.django_db
def test_b06_max_wait_prevents_starvation(clock, burst, settings):
    both = (summarize, summarize_replace)
    for k in range(15):
        clock(minutes=2 * k)
        burst()
        assert RAN == []
        for task_obj in both:
            if k == 5:  # the ceiling is fixed when the window opens
                job = task_obj.apply_async((1,), {"msg": k}, debounce_max_wait="2h")
            else:
                job = task_obj.delay(1, msg=k)
            assert job.outcome == ("created" if k == 0 else "debounced")
            assert (job.run_at, job.max_run_at) == (min(m(2 * k + 5), m(30)), m(30))
            assert ready_rows(task_obj, "sum:1") == 1
    clock(minutes=29, seconds=59)
    burst()
    assert RAN == []
    clock(minutes=30)
    burst()
    assert sorted(RAN) == [
        ("summarize", (1,), {"msg": 0}),
        ("summarize_replace", (1,), {"msg": 14}),
    ]
    assert [j.enqueue_count for j in Job.objects.order_by("id")] == [15, 15]

    for minute in (32, 34, 36, 38, 40):
        clock(minutes=minute)
        burst()
        for task_obj in both:
            job = task_obj.delay(1, msg=minute)
            if minute == 32:
                assert (job.outcome, job.opened_at, job.max_run_at) == ("created", m(32), m(62))
            assert ready_rows(task_obj, "sum:1") == 1
    assert [j.run_at for j in Job.objects.ready()] == [m(45), m(45)]
    clock(minutes=44, seconds=59)
    burst()
    assert len(RAN) == 2
    clock(minutes=45)
    burst()
    assert sorted(RAN[2:]) == [
        ("summarize", (1,), {"msg": 32}),
        ("summarize_replace", (1,), {"msg": 40}),
    ]
    assert len(RAN) == 4  # exactly 2 executions per task

    # Registration-time errors.
    for options in (
        {"debounce": "5m"},  # no max wait, no project default
        {"debounce": "5m", "debounce_max_wait": "4m"},
        {"debounce": "0s", "debounce_max_wait": "30m"},
        {"debounce": "-1m", "debounce_max_wait": "30m"},
        {"debounce": "5 minutes", "debounce_max_wait": "30m"},
        {"debounce": "5m", "debounce_max_wait": "0s"},
        {"debounce": "5m", "debounce_max_wait": "-1m"},
        {"debounce": "5m", "debounce_max_wait": "5 minutes"},
    ):
        with pytest.raises(ConfigurationError):
            task(name="enq.fr.b06_bad", **options)(summarize.func)
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = "30m"

    @window("summarize_default", "5m", None, "sum:{conv_id}")
    def summarize_default(conv_id, msg=None):
        pass

    assert summarize_default.delay(2).max_run_at == m(45 + 30)

    count = Job.objects.count()
    with pytest.raises(ConfigurationError, match="shorter than the window"):
        summarize.apply_async((3,), debounce_max_wait="1m")
    assert Job.objects.count() == count


# -- B08 ----------------------------------------------------------------------------------------


@window("slide", "2s", "10s", "v:{0}")
def slide(x):
    RAN.append(("slide", (x,), {}))


@pytest.mark.django_db
def test_b08_slide_clamp_vector(clock, burst):
    # No worker between the calls.
    job = None
    for t, expected in ((0, 2), (1, 3), (3, 5), (9, 10)):
        clock(seconds=t)
        if t == 3:
            assert fresh(job).is_open_window and fresh(job).run_at == sec(3)  # due, unclaimed
        job = slide.delay(1)
        row = fresh(job)
        assert (row.run_at, row.opened_at, row.max_run_at) == (sec(expected), T, sec(10))
    assert (row.enqueue_count, Job.objects.count()) == (4, 1)
    clock(seconds=9.999)
    burst()
    assert RAN == []
    clock(seconds=10)
    burst()
    assert RAN == [("slide", (1,), {})]
    clock(seconds=11)
    after = slide.delay(1)
    assert (after.outcome, after.opened_at, after.run_at, after.max_run_at) == (
        "created",
        sec(11),
        sec(13),
        sec(21),
    )

    # The same calls with a run@ just before each.
    RAN.clear()
    windows = []
    for t in (0, 1, 3, 9):
        clock(seconds=t)
        burst()
        windows.append(slide.delay(2))
    assert RAN == [("slide", (2,), {}), ("slide", (2,), {})]
    assert [w.outcome for w in windows] == ["created", "debounced", "created", "created"]
    w2, w3 = fresh(windows[2]), fresh(windows[3])
    assert (w2.opened_at, w2.run_at, w2.max_run_at, w2.status) == (sec(3), sec(5), sec(13), Job.Status.SUCCESSFUL)  # fmt: skip
    assert (w3.opened_at, w3.run_at, w3.max_run_at, w3.status) == (sec(9), sec(11), sec(19), Job.Status.READY)  # fmt: skip

    # A shorter per-call window pulls the deadline earlier.
    clock(seconds=0)
    first = slide.delay(3)
    assert first.run_at == sec(2)
    clock(seconds=1)
    urgent = slide.apply_async((3,), debounce="500ms")
    assert (urgent.pk, urgent.run_at, urgent.max_run_at) == (first.pk, sec(1.5), sec(10))


# -- B09 ----------------------------------------------------------------------------------------


@window("sync_customer", "1m", "5m", "customer:{0}")
def sync_customer(customer_id):
    RAN.append(("sync_customer", (customer_id,), {}))


@window("send_customer_webhook", "1m", "5m", "customer:{0}")
def send_customer_webhook(customer_id):
    RAN.append(("send_customer_webhook", (customer_id,), {}))


@window("hashed_one", "1m", "5m", None)
def hashed_one(customer_id, x=None):
    pass


@window("hashed_two", "1m", "5m", None)
def hashed_two(customer_id, x=None):
    pass


@pytest.mark.django_db
def test_b09_windows_are_per_task(clock, burst):
    first = sync_customer.delay(5)
    clock(seconds=10)
    second = send_customer_webhook.delay(5)
    assert (second.outcome, second.pk != first.pk) == ("created", True)
    rows = list(Job.objects.ready().order_by("id"))
    assert [(r.task_name, r.debounce_key, r.run_at) for r in rows] == [
        (sync_customer.name, "customer:5", m(1)),
        (send_customer_webhook.name, "customer:5", m(1) + timedelta(seconds=10)),
    ]
    clock(minutes=1)
    burst()
    assert RAN == [("sync_customer", (5,), {})]
    clock(minutes=1, seconds=10)
    burst()
    assert RAN == [("sync_customer", (5,), {}), ("send_customer_webhook", (5,), {})]

    count = Job.objects.count()
    assert sync_customer.delay(5).pk != sync_customer.delay(6).pk
    assert Job.objects.count() == count + 2
    assert sync_customer.delay(5).outcome == "debounced"
    assert Job.objects.count() == count + 2
    one, two = hashed_one.delay(5, x=[1]), hashed_two.delay(5, x=[1])
    assert (one.outcome, two.outcome) == ("created", "created")
    assert one.debounce_key == two.debounce_key and one.pk != two.pk


# -- B10 ----------------------------------------------------------------------------------------


def _sync_variant(label: str, key):
    """The report's ``sync(account_id, region="eu")`` [1m / 5m / ``key``], as task ``enq.fr.<label>``."""

    def sync(account_id, region="eu"):
        RAN.append((label, (account_id, region), {}))

    sync.__qualname__ = f"sync_{label}"
    return window(label, "1m", "5m", key)(sync)


sync_by_name = _sync_variant("sync_by_name", "sync:{account_id}:{region}")
sync_pos = _sync_variant("sync_pos", "sync:{0}")
sync_second = _sync_variant("sync_second", "sync:{1}")
sync_bad_name = _sync_variant("sync_bad_name", "report:{user}")
sync_bad_index = _sync_variant("sync_bad_index", "sync:{2}")
sync_item = _sync_variant("sync_item", "sync:{0[id]}")


def _key_or_none(account_id, region="eu"):
    return None if account_id == 0 else f"c:{account_id}"


sync_callable = _sync_variant("sync_callable", _key_or_none)


@window("order", "1m", "5m", None)
def order(order_id):
    pass


@pytest.mark.django_db
def test_b10_key_templates_resolve_per_call(clock, django_assert_num_queries):
    jobs = [sync_by_name.delay(5), sync_by_name.delay(5, "eu"), sync_by_name.delay(account_id=5)]
    assert len({j.pk for j in jobs}) == 1 and fresh(jobs[0]).debounce_key == "sync:5:eu"
    assert sync_pos.delay(5).pk == sync_pos.delay(account_id=5).pk
    assert Job.objects.get(task_name=sync_pos.name).debounce_key == "sync:5"
    assert sync_second.delay(5).debounce_key == "sync:eu"
    assert sync_item.delay({"id": 5}).debounce_key == "sync:5"
    keys = list(Job.objects.values_list("debounce_key", flat=True))
    assert not [k for k in keys if "None" in k or "{" in k]
    assert Job.objects.count() == 4

    for call in (
        lambda: sync_bad_name.delay(5),
        lambda: sync_bad_index.delay(5),
        lambda: sync_pos.delay(None),
        lambda: sync_pos.delay({"id": 5}),
    ):
        with django_assert_num_queries(0), pytest.raises(KeyResolutionError) as info:
            call()
        assert isinstance(info.value, ValueError)
        assert Job.objects.count() == 4

    with transaction.atomic():
        with pytest.raises(KeyResolutionError):
            sync_pos.delay({"id": 6})
        Order.objects.create(name="kept")
        good = sync_pos.delay(6)
    assert Order.objects.filter(name="kept").exists()
    assert fresh(good).debounce_key == "sync:6"

    first = order.delay(1)
    assert order.delay(1).pk == order.delay(order_id=1).pk == first.pk
    assert fresh(first).enqueue_count == 3
    assert order.delay(2).pk != first.pk
    assert Job.objects.filter(task_name=order.name).count() == 2

    plain = sync_callable.delay(0)
    assert (plain.outcome, plain.run_at, plain.opened_at, plain.debounce_key) == ("created", T, None, None)  # fmt: skip


CHILD = """
import json, sys
import django
django.setup()
from django_debounce import enqueue, registry
from django_debounce.exceptions import KeyResolutionError
from django_debounce.models import Job

name = sys.argv[1]
out = {
    "imported": [m for m in sys.modules if m.startswith("tests.") and ".test_" in m],
    "registered": registry.lookup(name) is not None,
}
options = {"debounce": "1m", "debounce_max_wait": "5m", "debounce_key": "sync:{0}"}
before = Job.objects.count()
try:
    enqueue(name, kwargs={"account_id": 5}, **options)
    out["by_kwargs"] = "no error"
except KeyResolutionError:
    out["by_kwargs"] = "KeyResolutionError"
out["written_by_error"] = Job.objects.count() - before
job = enqueue(name, args=(5,), **options)
out.update(id=job.pk, outcome=job.outcome, key=job.debounce_key, count=job.enqueue_count)
print(json.dumps(out))
"""


@pytest.mark.django_db(transaction=True)
def test_b10_key_templates_resolve_per_call_by_name_in_another_process():
    window = sync_pos.delay(5)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, sync_pos.name],
        env=child_env(),
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["imported"] == [] and out["registered"] is False  # never imported sync
    assert (out["by_kwargs"], out["written_by_error"]) == ("KeyResolutionError", 0)
    assert (out["id"], out["outcome"], out["key"], out["count"]) == (window.pk, "debounced", "sync:5", 2)  # fmt: skip
    assert Job.objects.count() == 1 and fresh(window).enqueue_count == 2
