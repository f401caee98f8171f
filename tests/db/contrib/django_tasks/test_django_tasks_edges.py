"""Django's ``@task`` honours edges, window handles and rate limits per key (issue #21 item 4).

Window 10 s, max wait 60 s, under the frozen clock; runs go through the real
worker command (``run_debounce_worker --burst``, in this process). The
rate-limited task is declared on demand (a gated task left registered would send
every later test's claim through the gate).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_debounce import registry
from django_debounce.contrib.django_tasks.results import JobCancelledError, TaskResultStatus
from django_debounce.contrib.django_tasks.windows import window, window_for
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job
from tests.conftest import T
from tests.testapp.tasks_django import add, task

pytestmark = pytest.mark.django_db
RUNS: list[tuple[str, int]] = []


def s(seconds: float):
    return T + timedelta(seconds=seconds)


@task(debounce="10s", debounce_key="doc:{0}", debounce_max_wait="60s", debounce_edge="both")
def rebuild(doc: int, revision: int = 0) -> int:
    """Both edges: a burst's first call at once, one trailing run after quiet."""
    RUNS.append((f"doc:{doc}", revision))
    return revision


def limited(customer: str, n: int) -> int:
    """At most one run per minute per customer (declared by the fixture)."""
    RUNS.append((customer, n))
    return n


@pytest.fixture(autouse=True)
def _runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


@pytest.fixture
def per_key() -> Iterator[Any]:
    declared = task(
        debounce="1s", debounce_key="{0}", debounce_max_wait="1h", rate_limit_per_key="1/m"
    )(limited)
    yield declared
    registry.unregister(declared.module_path)


def test_a_both_edge_task_runs_the_leading_call_then_one_trailing_run(clock, burst):
    first = rebuild.enqueue(1, revision=0)
    assert (first.status, first.kwargs) == (TaskResultStatus.READY, {"revision": 0})
    burst()
    assert rebuild.get_result(first.id).return_value == 0
    clock(seconds=3)
    second = rebuild.enqueue(1, revision=1)
    clock(seconds=5)
    assert rebuild.enqueue(1, revision=2).id == second.id != first.id
    state = window(rebuild, 1).inspect()
    assert state is not None
    assert (state.job_id, state.edge, state.calls, state.payload) == (
        int(second.id),
        "both",
        2,
        ((1,), {"revision": 1}),
    )
    assert (state.opened_at, state.deadline, state.ceiling, state.burst_until) == (
        T,
        s(15),
        s(60),
        s(15),
    )
    # What the result has a place for agrees with the handle: id, status and the payload.
    result = rebuild.get_result(second.id)
    assert (result.status, result.args, result.kwargs) == (
        TaskResultStatus.READY,
        [1],
        {"revision": 1},
    )
    clock(seconds=14.999)
    burst()
    assert RUNS == [("doc:1", 0)]
    clock(seconds=15)
    burst()
    assert RUNS == [("doc:1", 0), ("doc:1", 1)]
    assert rebuild.get_result(second.id).return_value == 1


def test_flush_and_cancel_through_a_django_tasks_window(clock, burst):
    rebuild.enqueue(2, revision=0)
    burst()
    clock(seconds=2)
    trailing = rebuild.enqueue(2, revision=1)
    action = window(rebuild, 2).flush()
    assert (action.done, action.reason, action.window.deadline) == (True, "flushed", s(2))
    burst()
    assert RUNS == [("doc:2", 0), ("doc:2", 1)]
    assert rebuild.get_result(trailing.id).status == TaskResultStatus.SUCCESSFUL

    clock(seconds=30)  # the burst closed at T+12: a new one
    lead = rebuild.enqueue(2, revision=5)
    cancelled = window_for(rebuild, "doc:2").cancel()
    assert (cancelled.done, cancelled.window.job_id) == (True, int(lead.id))
    burst()
    assert RUNS == [("doc:2", 0), ("doc:2", 1)]
    result = rebuild.get_result(lead.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is JobCancelledError


def test_a_rate_limit_per_key_defers_a_keys_second_run_to_its_next_token(clock, burst, per_key):
    first = {key: per_key.enqueue(key, 1) for key in ("acme", "bolt")}
    clock(seconds=1)
    burst()
    assert sorted(RUNS) == [("acme", 1), ("bolt", 1)]
    clock(seconds=2)
    again = per_key.enqueue("acme", 2)
    clock(seconds=3)
    burst()
    assert sorted(RUNS) == [("acme", 1), ("bolt", 1)]  # acme's bucket is empty until T+61
    assert per_key.get_result(again.id).status == TaskResultStatus.READY
    clock(seconds=60.999)
    burst()
    assert len(RUNS) == 2
    clock(seconds=61)
    burst()
    assert RUNS[-1] == ("acme", 2)
    assert per_key.get_result(again.id).return_value == 2
    assert Job.objects.get(pk=int(again.id)).started_at == s(61)
    assert all(per_key.get_result(r.id).return_value == 1 for r in first.values())


def test_a_window_of_a_task_without_one_is_refused():
    with pytest.raises(ConfigurationError, match="debounce"):
        window(add, 1, 2)
    with pytest.raises(ConfigurationError, match="not a Django task of DebounceBackend"):
        window(object(), 1)  # type: ignore[arg-type]
