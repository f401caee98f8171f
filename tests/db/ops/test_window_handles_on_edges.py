"""Window handles on leading bursts racing a worker's claim (attack, decisions 172 and 180).

Threads with their own connections on PostgreSQL and MariaDB: one claims, one
cancels (or flushes) the same leading burst at the same moment. The claim is the
worker's (``claim_batch`` with retries on a lost deadlock). A job is either
cancelled and never claimed, or claimed and reported ``claimed``; never both,
and never a raw database error. Last, two callers race one leading key, each
inside its own ``transaction.atomic()``: one leading job, the other call swallowed.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_debounce import debounced_task
from django_debounce.claim.claiming import claim_batch
from django_debounce.models import Job

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

ROUNDS = 12


@debounced_task(
    name="atk.handles.leading",
    debounce="10s",
    debounce_max_wait="60s",
    debounce_key="k:{0}",
    debounce_edge="leading",
)
def leading(key, revision=0):
    return None


def _race(first, second):
    barrier = threading.Barrier(2)
    results: list[object] = [None, None]
    errors: list[BaseException] = []

    def run(index, func):
        try:
            barrier.wait(10)
            results[index] = func()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results, errors


@pytest.mark.parametrize("operation", ["cancel", "flush"])
def test_a_handle_racing_a_claim_of_a_pending_leading_job(operation):
    lease = timedelta(minutes=5)
    for round_ in range(ROUNDS):
        job = leading.delay(round_)
        leading.delay(round_, revision=1)  # swallowed: the job counts two calls
        (claimed, action), errors = _race(
            # As the worker claims: a claim that loses a deadlock (MariaDB 1213) claims again.
            lambda: (
                claim_batch(  # noqa: B023
                    worker_id=f"w{round_}",  # noqa: B023
                    limit=10,
                    lease=lease,
                    attempts=10,
                ).jobs
            ),
            lambda: getattr(leading.window(round_), operation)(),  # noqa: B023
        )
        assert errors == []
        row = Job.objects.get(pk=job.pk)
        claimed_ids = [j.pk for j in claimed]
        if action.reason == "claimed":
            assert (claimed_ids, row.status, action.done) == ([job.pk], "RUNNING", False)
        elif operation == "cancel":
            assert (action.reason, action.done, claimed_ids, row.status) == (
                "cancelled",
                True,
                [],
                "CANCELLED",
            )
        else:
            assert (action.reason, action.done, row.enqueue_count) == ("flushed", True, 2)
            assert row.status in ("READY", "RUNNING")
        assert row.kwargs == {}  # the first call's payload, whatever won
        Job.objects.filter(pk=job.pk).update(status="SUCCESSFUL", window_key=None)


def test_leading_calls_racing_inside_callers_transactions_give_one_leading_job():
    """Two callers, each in its own ``transaction.atomic()``, call one leading key at once."""
    from django.db import transaction

    from django_debounce.exceptions import DebounceError

    outcomes: list[str] = []
    for round_ in range(ROUNDS):

        def call(revision, key=round_):
            try:
                with transaction.atomic():
                    return leading.delay(key, revision=revision).outcome
            except DebounceError as exc:  # the package's own error: the caller retries
                return type(exc).__name__

        results, errors = _race(lambda: call(0), lambda: call(1))
        assert errors == [], errors
        outcomes.extend(results)
        assert Job.objects.filter(task_name=leading.name, args=[round_]).count() == 1
    assert set(outcomes) <= {"created", "debounced", "EnqueueContentionError"}
