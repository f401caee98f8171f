"""A gated claim runs what its locked rows hold and takes tokens only for jobs it holds (issue #17).

Once any registered task is gated, a claim reads its candidates without row
locks, then locks the jobs it takes (decision 43). These tests commit work from
another connection in exactly that gap (the claim's call to ``lock_due`` runs it
first) and check what the claim then takes:

* item 1: a merged call or a replaced payload committed in the gap runs (the
  job returned is the locked row, ``enqueue_count`` included);
* item 5: a Redis bucket in drop mode never sheds a job because a concurrent
  claim held a token it then gave back;
* item 9: a claimer stalled inside the first claim of a newly gated task does
  not stall another claimer.

Row-lock databases only (PostgreSQL and MariaDB): SQLite serialises claims.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from django_debounce import debounced_task, registry, task
from django_debounce.claim import gated as gated_claim
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow import admission
from django_debounce.flow.redis_buckets import store
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import DeadLetter, Job, TaskState
from django_debounce.run.execution import run_job
from tests.conftest import T
from tests.factories import JobFactory
from tests.procs import in_thread
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

LEASE = dt.timedelta(seconds=60)
Status = Job.Status


def _record(*args: Any) -> None:
    CallLog.objects.create(task="lr", payload={"args": list(args)})


def _union(stored: Any, new: Any) -> tuple[list[Any], dict[str, Any]]:
    return [sorted(set(stored[0][0]) | set(new[0][0]))], {}


@contextmanager
def registered(*names: str) -> Iterator[None]:
    try:
        yield
    finally:
        for name in names:
            registry.unregister(name)


@pytest.fixture
def windows() -> Iterator[dict[str, Any]]:
    """A merging and a replacing window (10 s, ceiling 20 s), and a gated task that turns the
    gated claim on for every job."""
    window = {"debounce": "10s", "debounce_max_wait": "20s", "debounce_key": "k"}
    merged = debounced_task(name="lr.merged", debounce_merge=_union, **window)(_record)
    replaced = debounced_task(name="lr.replaced", debounce_replace_payload=True, **window)(_record)
    task(name="lr.gate", rate_limit="100/s")(_record)
    with registered("lr.merged", "lr.replaced", "lr.gate"):
        yield {"merged": merged, "replaced": replaced}


def before_the_lock(monkeypatch: pytest.MonkeyPatch, work: Callable[[], Any]) -> list[Any]:
    """Run ``work`` on a connection of its own, committed, when the claim first locks jobs."""
    real = gated_claim.lock_due
    results: list[Any] = []
    pending = [work]

    def lock_due(*args: Any) -> Any:
        if pending:  # once, and not again inside ``work`` (it may claim too)
            results.append(in_thread(pending.pop()))
        return real(*args)

    monkeypatch.setattr(gated_claim, "lock_due", lock_due)
    return results


def claim(worker_id: str = "w", limit: int = 10) -> list[Job]:
    return claim_jobs(worker_id=worker_id, limit=limit, lease=LEASE)


@pytest.mark.parametrize(
    ("name", "calls", "stored"),
    [("merged", ([1], [2]), [[1, 2]]), ("replaced", (["old"], ["new"]), [["new"]])],
)
def test_a_call_committed_between_the_read_and_the_lock_runs(
    windows, clock, monkeypatch, name, calls, stored
):
    """Item 1: the task ran ``[1]`` while the row held ``[1, 2]`` (merged items lost)."""
    first, second = calls
    windows[name].delay(first)
    clock(seconds=20)  # due at its ceiling: a slide keeps it due
    slid = before_the_lock(monkeypatch, lambda: windows[name].delay(second))

    (job,) = claim()

    assert slid[0].pk == job.pk  # the call joined the window that was claimed
    row = Job.objects.get(pk=job.pk)
    assert (job.args, job.enqueue_count) == (row.args, row.enqueue_count) == (stored, 2)
    run_job(job, worker_id="w", using="default")
    assert list(CallLog.objects.values_list("payload", flat=True)) == [{"args": stored}]
    assert Job.objects.get(pk=job.pk).status == Status.SUCCESSFUL


@pytest.fixture
def redis_drop(settings: Any) -> Iterator[None]:
    """``lr.drop`` at "2/h", drop mode, its bucket in Redis."""
    require_redis()
    settings.DEBOUNCE_REDIS = "redis"
    task(name="lr.drop", rate_limit="2/h", on_excess="drop")(_record)
    try:
        yield
    finally:
        registry.unregister("lr.drop")
        delete_test_keys(cache_url(), key_prefix())


def test_a_redis_bucket_never_sheds_for_a_token_another_claim_gives_back(
    redis_drop, clock, monkeypatch
):
    """Item 5: a claim took the 2 tokens, lost its jobs to a concurrent claim and gave them
    back; the concurrent claim, refused, shed all 10 jobs; Redis kept 2 tokens unused."""
    ids = [JobFactory(task_name="lr.drop", args=[i], run_at=T).pk for i in range(10)]
    before_the_lock(monkeypatch, lambda: [job.pk for job in claim("other")])

    assert claim("first") == []  # the other claim locked them all first

    rows = dict(Job.objects.values_list("pk", "status"))
    assert [rows[pk] for pk in ids] == [Status.RUNNING] * 2 + [Status.SHED] * 8
    assert set(Job.objects.filter(status=Status.RUNNING).values_list("worker_id", flat=True)) == {
        "other"
    }
    assert DeadLetter.objects.filter(reason__startswith="shed:").count() == 8
    buckets = store()
    assert buckets is not None
    level = buckets.levels({"lr.drop": bucket_for("2/h")})["lr.drop"]
    assert level.tokens is not None and level.tokens < 1  # both tokens went to the 2 runs


def test_a_stalled_first_claim_of_a_new_gated_task_does_not_stall_another_claimer(monkeypatch):
    """Item 9: the first claim inserted the task's state row inside its transaction; a second
    claimer's insert of the same row waited for it (the lock timeout, or for ever)."""
    task(name="lr.capped", concurrency=1)(_record)
    stalled, release = threading.Event(), threading.Event()
    real_save = admission.Admission.save

    def save(self: admission.Admission) -> None:
        if threading.current_thread().name == "stalled-claimer":
            stalled.set()
            release.wait(30)
        real_save(self)

    monkeypatch.setattr(admission.Admission, "save", save)
    with ExitStack() as stack:
        stack.callback(registry.unregister, "lr.capped")
        stack.callback(release.set)
        capped = [JobFactory(task_name="lr.capped", args=[i]).pk for i in range(2)]
        plain = JobFactory(args=["plain"]).pk
        assert not TaskState.objects.exists()  # a task gated for the first time
        box: dict[str, Any] = {}
        first = threading.Thread(
            target=_claim_into, args=(box, "first", 1), name="stalled-claimer", daemon=True
        )
        first.start()
        assert stalled.wait(10), "the first claim never reached its save"

        second = in_thread(lambda: [job.pk for job in claim("second", 5)], timeout=10)

        assert second == [plain]  # the capped task's row is held by the stalled claim
        release.set()
        first.join(10)
        assert box["ids"] == capped[:1]


def _claim_into(box: dict[str, Any], worker_id: str, limit: int) -> None:
    from django.db import connections

    try:
        box["ids"] = [job.pk for job in claim(worker_id, limit)]
    finally:
        connections.close_all()
