"""Enqueue belongs to the caller's transaction (§4.6): B19, B20.

A rolled-back transaction leaves no job and undoes a slide; no worker sees a
job before the caller commits. Second connections are real: other threads of
this process, each with its own database connection.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.test import Client

from django_debounce.models import DeadLetter, Job
from django_debounce.worker.loop import Worker
from tests.conftest import T, run_burst
from tests.procs import WorkerThread, in_thread, wait_for
from tests.testapp.models import CallLog, Order
from tests.testapp.tasks_reliability import process_order, slide, welcome, work

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]


def _burst_elsewhere() -> int:
    """run@now from another connection; return how many jobs it ran."""
    return in_thread(lambda: Worker(burst=True, handle_signals=False).run())


def test_b19_enqueue_is_transactional(clock):
    User = get_user_model()

    # Rollback: an IntegrityError after the enqueue leaves no job behind.
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            user = User.objects.create(username="ada")
            j = welcome.delay(user.pk)
            assert j.id is not None and j.outcome == "created"
            User.objects.create(username="ada")  # duplicate username
    assert not Job.objects.filter(pk=j.id).exists()
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    run_burst()
    assert CallLog.objects.count() == 0

    # Commit: invisible to a second connection and to a worker until the commit.
    with transaction.atomic():
        user = User.objects.create(username="bob")
        j = welcome.delay(user.pk)
        assert in_thread(lambda: Job.objects.filter(pk=j.pk).exists()) is False
        assert _burst_elsewhere() == 0
        assert CallLog.objects.count() == 0
        assert Job.objects.get(pk=j.pk).attempts == 0
    assert in_thread(lambda: Job.objects.filter(pk=j.pk).exists()) is True
    assert Job.objects.count() == 1
    run_burst()
    assert list(CallLog.objects.values_list("key", flat=True)) == ["bob"]
    assert Job.objects.get(pk=j.pk).status == Job.Status.SUCCESSFUL

    # Slide rollback: the window is exactly as it was before the rolled-back call.
    clock(minutes=0)
    first = slide.delay("a", "v1")  # committed at T
    assert first.outcome == "created" and first.run_at == T + timedelta(minutes=5)
    clock(minutes=2)
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            again = slide.delay("a", "v2")
            assert (again.pk, again.outcome) == (first.pk, "debounced")
            assert again.run_at == T + timedelta(minutes=7)
            raise RuntimeError("roll back")
    job = Job.objects.get(task_name="rel.slide")
    assert job.pk == first.pk
    assert job.run_at == T + timedelta(minutes=5)
    assert job.enqueue_count == 1
    assert job.last_enqueued_at == T
    assert job.args == ["a", "v1"]
    clock(minutes=5)
    run_burst()
    assert CallLog.objects.get(task="rel.slide").payload == {"version": "v1"}


def test_b19_call_blocked_by_a_rolled_back_slide_still_counts(clock):
    """A second producer waiting on the window's row lock slides it once the first rolls back."""
    first = slide.delay("b", "v1")
    clock(minutes=2)
    box: dict = {}
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            again = slide.delay("b", "v2")
            assert (again.pk, again.outcome, again.enqueue_count) == (first.pk, "debounced", 2)
            clock(minutes=3)
            other = threading.Thread(target=_slide_into, args=(box, "b", "v3"), daemon=True)
            other.start()
            time.sleep(0.5)
            assert other.is_alive()  # waiting for the locked window row
            raise RuntimeError("roll back")
    other.join(15)
    assert not other.is_alive() and "error" not in box, box
    assert (box["pk"], box["outcome"], box["count"]) == (first.pk, "debounced", 2)

    # Only the other producer's call counts; the rolled-back one left no trace.
    job = Job.objects.get()
    assert job.pk == first.pk
    assert job.enqueue_count == 2
    assert job.run_at == T + timedelta(minutes=8)
    assert job.last_enqueued_at == T + timedelta(minutes=3)
    assert job.args == ["b", "v3"]


def _slide_into(box: dict, key: str, version: str) -> None:
    try:
        job = slide.delay(key, version)
        box.update(pk=job.pk, outcome=job.outcome, count=job.enqueue_count)
    except BaseException as exc:
        box["error"] = exc
    finally:
        connections.close_all()


def test_b20_no_claim_before_commit():
    worker = WorkerThread("B20", poll_interval=0.05).start()
    try:
        with transaction.atomic():
            order = Order.objects.create(name="o-1")
            job = process_order.delay(order.pk)
            # A job committed by another connection meanwhile runs: the worker is polling.
            in_thread(lambda: work.delay("canary"))
            wait_for(
                lambda: CallLog.objects.filter(task="rel.work", key="canary").exists(),
                timeout=15,
                what="the worker to run the canary",
            )
            time.sleep(0.5)  # ~10 more polls
            assert not CallLog.objects.filter(task="rel.process_order").exists()
            job.refresh_from_db()
            assert (job.status, job.attempts) == (Job.Status.READY, 0)

        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL,
            timeout=15,
            what="the worker to run the committed job",
        )
        assert CallLog.objects.get(task="rel.process_order").key == "o-1"  # found the Order
        assert Job.objects.filter(status=Job.Status.FAILED).count() == 0
        assert DeadLetter.objects.count() == 0

        # An inner block that enqueues and raises, inside an outer block that commits.
        with transaction.atomic():
            Order.objects.create(name="outer")
            try:
                with transaction.atomic():
                    inner = Order.objects.create(name="inner")
                    process_order.delay(inner.pk)
                    raise RuntimeError("inner failure")
            except RuntimeError:
                pass
        assert Order.objects.filter(name="outer").exists()
        assert not Order.objects.filter(name="inner").exists()
        assert Job.objects.filter(task_name="rel.process_order").count() == 1  # o-1 only
        assert worker.alive()
    finally:
        worker.stop()
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 0
    assert DeadLetter.objects.count() == 0


def test_b20_atomic_requests_view_that_fails_leaves_no_job(monkeypatch):
    monkeypatch.setitem(connections.settings[DEFAULT_DB_ALIAS], "ATOMIC_REQUESTS", True)
    assert connections[DEFAULT_DB_ALIAS].settings_dict["ATOMIC_REQUESTS"] is True
    client = Client(raise_request_exception=False)

    response = client.get("/rel/enqueue-then-fail/", {"name": "v500"})
    assert response.status_code == 500
    assert Job.objects.count() == 0
    assert not Order.objects.filter(name="v500").exists()

    # The same view code that returns normally commits both rows, and the job runs.
    response = client.get("/rel/enqueue-ok/", {"name": "v200"})
    assert response.status_code == 200
    job = Job.objects.get()
    assert str(job.pk) == response.content.decode()
    assert _burst_elsewhere() == 1
    assert Job.objects.get().status == Job.Status.SUCCESSFUL
    assert CallLog.objects.get(task="rel.process_order").key == "v200"
    assert DeadLetter.objects.count() == 0
