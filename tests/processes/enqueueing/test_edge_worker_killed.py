"""A worker SIGKILLed while the leading job of a both burst runs (attack, decision 180; §4.5).

A real ``run_debounce_worker`` (prefetch on, 2 s lease) runs the burst's
leading job, which sleeps; the burst's second call creates its trailing job;
the worker is killed; a second worker takes over. The trailing job must not
start while the killed run's lease is live, must run once with the newest
payload, and the dead run must end (its lease lapsed, no retries left).
"""

from __future__ import annotations

import os
import signal

import pytest

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import edge_slow

pytestmark = [pytest.mark.row_locks, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_killed_leading_run_holds_the_trailing_job_until_its_lease_lapses(tmp_path):
    env = child_env(DEBOUNCE_TEST_LEASE="2s", DEBOUNCE_TEST_PREFETCH="4")
    with processes(tmp_path, env) as procs:
        first = procs.worker("--poll-interval", "0.05", name="first")
        lead = edge_slow.delay("k", seq=0, seconds=60)
        wait_for(
            lambda: CallLog.objects.filter(job_id=lead.pk).exists(),
            timeout=60,
            what=lambda: f"the leading run to start\n{procs.tails()}",
        )
        trail = edge_slow.delay("k", seq=1)
        latest = edge_slow.delay("k", seq=2)
        assert (trail.outcome, latest.outcome, latest.pk) == ("created", "debounced", trail.pk)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        lease = Job.objects.get(pk=lead.pk).lease_expires_at
        procs.worker("--poll-interval", "0.05", name="second")
        wait_for(
            lambda: Job.objects.get(pk=trail.pk).status == Job.Status.SUCCESSFUL,
            timeout=60,
            what=lambda: f"the trailing job to run\n{procs.tails()}",
        )
        wait_for(
            lambda: Job.objects.get(pk=lead.pk).status != Job.Status.RUNNING,
            timeout=30,
            what=lambda: f"the killed run's lease to be reclaimed\n{procs.tails()}",
        )
    runs = list(CallLog.objects.filter(task="rel.edge_slow").order_by("started_at"))
    assert [(r.job_id, r.payload["seq"]) for r in runs] == [(lead.pk, 0), (trail.pk, 2)]
    assert runs[1].started_at >= lease  # never beside the killed run while its lease was live
    assert Job.objects.get(pk=lead.pk).status == Job.Status.FAILED
    # The burst is over: the next call, later, leads a new burst and runs at once.
    assert Job.objects.filter(task_name="rel.edge_slow").count() == 2
