"""A job run by a real ``celery worker`` reports progress (decisions 202, 204).

The job's row holds it, and its Celery task (id = job id) is in state ``PROGRESS``
with the same numbers while it runs; its SUCCESS replaces that when it ends.
"""

from __future__ import annotations

import pytest

from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.models import Job
from tests.processes.celery_rig import CeleryRig
from tests.procs import processes, wait_for
from tests.testapp.tasks_celery import progress

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]


def test_a_celery_run_stores_its_progress_on_the_job_and_as_celery_progress_state(
    tmp_path, settings
) -> None:
    from celery.result import AsyncResult

    from tests.celery_app import REDIS, make_app, with_results

    gate = tmp_path / "go"
    with processes(tmp_path, {}) as procs:
        rig = CeleryRig("redis", procs, DEBOUNCE_TEST_LEASE="3s")
        prefix = f"{rig.queue}:"
        rig.env["DEBOUNCE_TEST_RESULT_PREFIX"] = prefix
        for name, value in rig.settings().items():
            setattr(settings, name, value)
        results = with_results(make_app(REDIS), prefix)
        job = progress.delay(str(gate))
        state = AsyncResult(str(job.pk), app=results)
        try:
            rig.worker()
            assert celery_executor.dispatch_due(app=rig.app) == 1

            def reported() -> bool:
                row = Job.objects.get(pk=job.pk)
                return row.progress_done is not None

            wait_for(reported, timeout=60, what=rig.procs.tails)
            row = Job.objects.get(pk=job.pk)
            assert (row.status, row.progress_done, row.progress_total, row.progress_note) == (
                Job.Status.RUNNING,
                2,
                5,
                "halfway there",
            )
            wait_for(lambda: state.state == "PROGRESS", timeout=10, what=rig.procs.tails)
            assert state.info == {"done": 2, "total": 5, "percent": 40, "note": "halfway there"}
            gate.touch()
            wait_for(lambda: state.state == "SUCCESS", timeout=60, what=rig.procs.tails)
            assert state.result == "reported"
            row.refresh_from_db()
            assert (row.status, row.progress_done, row.progress_note) == (
                Job.Status.SUCCESSFUL,
                5,
                "all done",
            )
        finally:
            procs.kill_all()
            rig.close()
            state.forget()
