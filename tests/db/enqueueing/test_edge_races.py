"""Racing calls of a leading or both task (decision 180): one burst, one leading job (§4.4).

Threads of this process, each with its own connection, call at one frozen
instant; a further thread claims meanwhile, so a leading job may be claimed
between two calls of its burst.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_debounce import debounced_task
from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import Job

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}
CALLERS = 8


@debounced_task(name="edge_race.leading", debounce_edge="leading", **WINDOW)
def leading(doc, revision=0):
    pass


@debounced_task(name="edge_race.both", debounce_edge="both", **WINDOW)
def both(doc, revision=0):
    pass


def _race(t) -> list[str]:
    """Call ``t`` from CALLERS threads at once while another claims; return the outcomes."""
    start = threading.Barrier(CALLERS + 1)
    outcomes: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def call(revision: int) -> None:
        try:
            start.wait(10)
            outcomes.append(t.delay(1, revision=revision).outcome)
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            errors.append(exc)
        finally:
            connections.close_all()

    def claim() -> None:
        try:
            start.wait(10)
            while not done.is_set():
                claim_jobs(worker_id="racer", limit=5, lease=timedelta(minutes=5))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    claimer = threading.Thread(target=claim, daemon=True)
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(CALLERS)]
    claimer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    done.set()
    claimer.join(30)
    assert not errors, errors
    return sorted(outcomes)


def test_racing_calls_of_a_leading_task_leave_one_leading_job(clock):
    outcomes = _race(leading)
    assert outcomes == ["created"] + ["debounced"] * (CALLERS - 1)
    job = Job.objects.get()
    assert job.enqueue_count == CALLERS
    assert Job.objects.filter(window_key__isnull=False).count() <= 1


def test_racing_calls_of_a_both_task_leave_one_leading_and_one_trailing_job(clock):
    outcomes = _race(both)
    assert outcomes == ["created"] * 2 + ["debounced"] * (CALLERS - 2)
    lead, trail = Job.objects.order_by("pk")
    assert (lead.window_key, lead.run_at, lead.enqueue_count) == (None, lead.opened_at, 1)
    assert trail.window_key is not None and trail.enqueue_count == CALLERS - 1
    assert (trail.opened_at, trail.max_run_at) == (lead.opened_at, lead.max_run_at)
