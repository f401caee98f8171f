"""Progress through a real ``run_debounce_worker`` whose run loses its lease (decisions 202, 203).

Worker A runs attempt 1 and reports 1 of 3; it is stopped (SIGSTOP) until its 2 s
lease lapses; worker B reclaims the job and runs attempt 2 to its end (3 of 3).
A is then let go and finishes attempt 1, reporting 3 of 3 too: its writes are
fenced out, so the row keeps attempt 2's progress, and a stopped-then-killed
worker's last written value is what the row shows meanwhile.
"""

from __future__ import annotations

import os
import signal

import pytest

from django_debounce.models import Job
from django_debounce.progress import Progress, progress_of
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_progress import gated

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _progress(job_id: int) -> tuple[int | None, int | None, str]:
    return Job.objects.values_list("progress_done", "progress_total", "progress_note").get(
        pk=job_id
    )


@pytest.mark.row_locks
def test_a_run_that_lost_its_lease_never_overwrites_the_newer_runs_progress(tmp_path):
    gates = str(tmp_path / "gate")
    env = child_env(DEBOUNCE_TEST_LEASE="2s")
    with processes(tmp_path, env) as procs:
        first = procs.worker("--poll-interval", "0.05", name="first")
        job = gated.delay("k", gates)
        wait_for(
            lambda: _progress(job.pk) == (1, 3, "attempt 1 started"),
            timeout=60,
            what=lambda: f"attempt 1 to report\n{procs.tails()}",
        )
        os.kill(first.pid, signal.SIGSTOP)
        try:
            procs.worker("--poll-interval", "0.05", name="second")
            wait_for(
                lambda: _progress(job.pk) == (1, 3, "attempt 2 started"),
                timeout=60,
                what=lambda: f"attempt 2 to report\n{procs.tails()}",
            )
            open(f"{gates}.2", "w").close()
            wait_for(
                lambda: Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL,
                timeout=60,
                what=lambda: f"attempt 2 to end\n{procs.tails()}",
            )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        open(f"{gates}.1", "w").close()
        wait_for(
            lambda: CallLog.objects.filter(task="prog.gated", payload__attempt=1).exists(),
            timeout=60,
            what=lambda: f"the stale attempt 1 to end\n{procs.tails()}",
        )
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.result) == (Job.Status.SUCCESSFUL, 2, "attempt 2")
    assert _progress(job.pk) == (3, 3, "attempt 2 done")
    assert progress_of(row) == Progress(3, 3, "attempt 2 done")
    assert sorted(CallLog.objects.values_list("payload__attempt", flat=True)) == [1, 2]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_held_value_reaches_the_row_at_a_lease_renewal_while_the_task_is_silent(
    tmp_path, threads
):
    from tests.testapp.tasks_progress import goes_silent

    gate = tmp_path / "go"
    env = child_env(DEBOUNCE_TEST_LEASE="2s")  # renewed every 2/3 s
    with processes(tmp_path, env) as procs:
        procs.worker("--poll-interval", "0.05", "--concurrency", threads)
        job = goes_silent.delay(str(gate))
        wait_for(
            lambda: _progress(job.pk) == (2, 2, "held back"),
            timeout=30,
            what=lambda: f"the held value to be written\n{procs.tails()}",
        )
        assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING  # before the run ends
        gate.touch()
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL,
            timeout=30,
            what=procs.tails,
        )
