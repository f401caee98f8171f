"""CoDel's state is one row per queue, shared by every worker of the queue (§6), on PostgreSQL and MariaDB.

Two real worker processes (``run_debounce_worker``, 2 threads each) drain one
backlog of a CoDel queue. Both read and advance the same
:class:`~django_debounce.models.QueueState` row under its lock inside their
claim transactions, so the drops of the whole deployment follow one control
law: one row, drop counts 1, 2, 3 … across both workers (two private states
would each start at 1), and every drop no earlier than the schedule
``interval / sqrt(count)`` allows.
"""

from __future__ import annotations

import json
import math
import signal
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_debounce.models import DeadLetter, Job, QueueState
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_codel import slow_drop

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

INTERVAL = 0.5
QUEUES = {"codelpg": {"codel": {"target": "100ms", "interval": f"{INTERVAL}s"}}}
JOBS = 300


def test_two_worker_processes_share_one_codel_state(tmp_path, settings):
    settings.DEBOUNCE_QUEUES = QUEUES
    env = child_env(DEBOUNCE_TEST_QUEUES=json.dumps(QUEUES))
    with processes(tmp_path, env) as procs:
        workers = [
            procs.worker(
                "--queue", "codelpg", "--concurrency", "2", "--poll-interval", "0.05", name=name
            )
            for name in ("w1", "w2")
        ]
        wait_for(
            lambda: all("starting" in w.stderr() for w in workers),
            timeout=60,
            what="both workers to start",
        )
        # One commit: a backlog whose every job has been due for a minute (far above target).
        with transaction.atomic():
            for n in range(JOBS):
                slow_drop.delay(n)
            Job.objects.filter(queue="codelpg").update(run_at=timezone.now() - timedelta(minutes=1))

        def drained() -> bool:
            for worker in workers:
                assert worker.alive(), worker.tail()
            return not Job.objects.filter(
                status__in=[Job.Status.READY, Job.Status.RUNNING]
            ).exists()

        wait_for(drained, timeout=180, interval=0.2, what="the backlog to drain")
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(30) == 0, worker.tail()

    runs = list(CallLog.objects.filter(task="codel.slow_drop"))
    letters = list(DeadLetter.objects.order_by("id"))
    ran = sorted(row.payload["n"] for row in runs)
    shed = sorted(letter.args[0] for letter in letters)
    assert sorted(ran + shed) == list(range(JOBS)), "every job ran or was shed, none both"
    assert len({row.pid for row in runs}) == 2, "both worker processes ran jobs"
    assert all(letter.reason.startswith("codel:") for letter in letters)
    assert all(letter.metadata["codel"] is True for letter in letters)
    assert Job.objects.filter(status=Job.Status.SHED).count() == len(letters)

    # One state row for the queue, out of dropping once the queue drained.
    (state,) = QueueState.objects.all()
    assert state.queue == "codelpg" and not state.dropping

    # One law for the deployment: drop counts run 1..n in commit order (letters are
    # written under the row lock), and drop k+1 comes no earlier than drop k's schedule.
    assert len(letters) >= 2, f"expected a dropping state, got {len(letters)} drop(s)"
    assert [letter.metadata["drop_count"] for letter in letters] == list(range(1, len(letters) + 1))
    times = [letter.created_at for letter in letters]
    due = times[0] + timedelta(seconds=INTERVAL)
    for count, at in enumerate(times[1:], start=2):
        assert at >= due - timedelta(milliseconds=1), (
            f"drop {count} at {at} before its schedule {due}"
        )
        due += timedelta(seconds=INTERVAL / math.sqrt(count))
    print(
        f"\n[codel] {len(runs)} ran, {len(letters)} shed by 2 workers over "
        f"{(times[-1] - times[0]).total_seconds():.2f}s of dropping"
    )
