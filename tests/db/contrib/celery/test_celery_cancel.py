"""Cancelling a running job on the Celery executor (decision 186): the mark works through its run.

The job is handed off and run by :func:`run_handed_off` (what a Celery worker's
``django_debounce.run_job`` task does) in a thread, while the test thread asks
for the cancel on its own connection.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from django_debounce.context import JobContext
from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.contrib.celery import handoff
from django_debounce.models import DeadLetter, Job
from django_debounce.tasks import task

pytestmark = pytest.mark.django_db(transaction=True)

STARTED = threading.Event()


@task(name="tl.celery_steps", executor="celery", takes_context=True)
def celery_steps(context: JobContext) -> str:
    STARTED.set()
    for _ in range(500):
        context.checkpoint()
        time.sleep(0.01)
    return "done"


def test_a_job_run_by_the_celery_executor_stops_at_its_checkpoint(settings):
    settings.DEBOUNCE_CANCEL_POLL_INTERVAL = 0.02
    STARTED.clear()
    job = celery_steps.delay()
    handoff.claim_for_handoff(scheduler_id="sched", limit=10, lease=dt.timedelta(seconds=30))
    results: list[object] = []
    thread = threading.Thread(
        target=lambda: results.append(celery_executor.run_handed_off(job.pk)), daemon=True
    )
    thread.start()
    assert STARTED.wait(5)
    assert job.cancel().requested == [job.pk]
    thread.join(5)
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert job.error.startswith("django_debounce.exceptions.JobCancelled: ")
    assert results == [None]
    assert not DeadLetter.objects.exists()
