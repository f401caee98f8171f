"""Edges and window handles behave the same through the Celery executor as through the worker.

Issue #21's "done when": one scenario, run once under ``run_debounce_worker``
and once under ``run_debounce_worker --dispatch-only`` handing jobs to a real
``celery worker`` (Redis broker): a ``debounce_edge="both"`` burst of three
calls, a window flushed with ``flush()`` and a window ended with ``cancel()``;
and a rate limit per key (``2/m``): a key's third run waits for its token while
another key runs. Both runs must give the same runs (which payload, how many),
the same cancelled job and the same held one. The tasks are in
tests/testapp/tasks_celery_windows.py (the per-key one registered only while its test
runs); the executor is chosen by ``DEBOUNCE_TEST_EXECUTOR`` (tests/settings_celery.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_debounce.flow.hold_reasons import held_back
from django_debounce.models import Job
from tests.processes.celery_rig import CeleryRig
from tests.procs import Processes, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery_windows import both, held, register_keyrated, unregister_keyrated

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

#: What the scenario leaves, whichever executor ran it: (task, key, payload n) per run, sorted, and
#: the statuses of the flushed and the cancelled windows' jobs.
EXPECTED = {
    "runs": [("celw.both", "b", 0), ("celw.both", "b", 1), ("celw.held", "f", 10)],
    "flushed": "SUCCESSFUL",
    "cancelled": "CANCELLED",
}


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with processes(tmp_path, {}) as group:
        yield group


def start(executor: str, procs: Processes, settings: Any, **env: str) -> CeleryRig:
    rig = CeleryRig("redis", procs, DEBOUNCE_TEST_EXECUTOR=executor, **env)
    for name, value in rig.settings().items():
        setattr(settings, name, value)
    if executor == "celery":
        rig.worker()
        rig.dispatcher("--poll-interval", "0.1")
    else:
        procs.worker("--poll-interval", "0.1", env=rig.env)
    return rig


def runs() -> list[tuple[str, str, int]]:
    logs = (
        CallLog.objects.filter(task__startswith="celw.")
        .exclude(key="warm")
        .order_by("started_at", "pk")
    )
    return [(log.task, log.key, log.payload["n"]) for log in logs]


@pytest.mark.parametrize("executor", ["worker", "celery"])
def test_edges_flush_and_cancel_run_the_same_on_either_executor(
    executor: str, procs: Processes, settings: Any
) -> None:
    rig = start(executor, procs, settings)
    try:
        # Once a first job ran, the executor is up: the leading run below can run at once.
        both.delay(key="warm")
        warm = CallLog.objects.filter(task="celw.both", key="warm")
        wait_for(warm.exists, timeout=60, what=procs.tails)
        # Two windows that only a flush or a cancel ends within the test.
        flushed = held.delay(key="f", n=10)
        assert held.delay(key="f", n=11).pk == flushed.pk
        cancelled = held.delay(key="c", n=20)
        state = held.window(key="f").inspect()
        assert state is not None and (state.job_id, state.calls, state.payload) == (
            flushed.pk,
            2,
            ((), {"key": "f", "n": 10}),
        )
        # A both burst: the first call runs at once, the next two gather into one trailing run.
        lead = both.delay(key="b", n=0)
        trailing = both.delay(key="b", n=1)
        assert both.delay(key="b", n=2).pk == trailing.pk != lead.pk
        wait_for(lambda: runs()[:1] == [("celw.both", "b", 0)], timeout=30, what=procs.tails)
        started = Job.objects.get(pk=lead.pk).started_at
        assert started - lead.created_at < timedelta(seconds=1), "it waited for the window"

        action = held.window(key="f").flush()
        assert (action.done, action.reason) == (True, "flushed")
        ended = held.window(key="c").cancel()
        assert (ended.done, ended.reason, ended.window.job_id) == (True, "cancelled", cancelled.pk)
        assert held.window(key="c").inspect() is None

        wait_for(lambda: len(runs()) >= 3, timeout=30, what=procs.tails)
        time.sleep(1.5)  # a fourth run (the cancelled window, a second trailing run) would show
        outcome = {
            "runs": sorted(runs()),  # the leading run came first: waited for above
            "flushed": Job.objects.get(pk=flushed.pk).status,
            "cancelled": Job.objects.get(pk=cancelled.pk).status,
        }
        assert outcome == EXPECTED
        workers = set(
            Job.objects.filter(task_name__startswith="celw.")
            .exclude(status="CANCELLED")
            .values_list("worker_id", flat=True)
        )
        prefix = "celery:" if executor == "celery" else ""
        assert len(workers) >= 1 and all(w.startswith(prefix) for w in workers)
        if executor == "worker":
            assert not any(w.startswith("celery:") for w in workers)
        trailing_job = Job.objects.get(pk=trailing.pk)
        assert (trailing_job.enqueue_count, trailing_job.kwargs) == (2, {"key": "b", "n": 1})
    finally:
        procs.kill_all()
        rig.close()


@pytest.mark.parametrize("executor", ["worker", "celery"])
def test_a_rate_limit_per_key_holds_the_same_jobs_on_either_executor(
    executor: str, procs: Processes, settings: Any
) -> None:
    keyrated = register_keyrated()  # gated: only while this test runs
    rig = start(executor, procs, settings, DEBOUNCE_CELW_KEYRATED="1")
    try:

        def rated() -> list[tuple[str, int]]:
            logs = CallLog.objects.filter(task="celw.keyrated").order_by("started_at", "pk")
            return [(log.key, log.payload["n"]) for log in logs]

        # Key a: three windows one after the other (each waits for the previous run), so
        # three jobs of one key; its bucket holds two tokens a minute. Key b runs meanwhile.
        for n in (1, 2):
            keyrated.delay(key="a", n=n)
            wait_for(lambda n=n: ("a", n) in rated(), timeout=60, what=procs.tails)
        third = keyrated.delay(key="a", n=3)
        keyrated.delay(key="b", n=1)
        wait_for(lambda: ("b", 1) in rated(), timeout=30, what=procs.tails)
        time.sleep(1.5)  # a third run of key a, were its bucket not judged, would show by now
        assert sorted(rated()) == [("a", 1), ("a", 2), ("b", 1)]
        job = Job.objects.get(pk=third.pk)
        assert (job.status, job.attempts, job.worker_id) == (Job.Status.READY, 0, "")
        assert [hold.code for hold in held_back(job)] == ["key_rate_limit"]
    finally:
        procs.kill_all()
        rig.close()
        unregister_keyrated()
