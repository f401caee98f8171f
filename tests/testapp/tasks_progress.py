"""A task that reports progress in a real ``run_debounce_worker`` (tests/processes/run/test_progress_worker.py)."""

from __future__ import annotations

import os

from django.utils import timezone

from django_debounce import task
from django_debounce.context import JobContext

from .models import CallLog
from .tasks_reliability import wait_for_file


@task(name="prog.gated", takes_context=True, max_retries=3)
def gated(context: JobContext, tag: str, gates: str) -> str:
    """Report 1 of 3, wait for the file ``<gates>.<attempt>``, report 3 of 3; log each end."""
    attempt = context.attempt
    context.set_progress(1, 3, f"attempt {attempt} started")
    wait_for_file(f"{gates}.{attempt}")
    context.set_progress(3, 3, f"attempt {attempt} done")
    CallLog.objects.create(
        task="prog.gated",
        key=tag,
        payload={"attempt": attempt},
        job_id=context.job.pk if context.job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    return f"attempt {attempt}"


@task(name="prog.goes_silent", takes_context=True, max_retries=0)
def goes_silent(context: JobContext, gate: str) -> str:
    """Report twice at once (the second is held back), then wait for the file ``gate``."""
    context.set_progress(1, 2, "first")
    context.set_progress(2, 2, "held back")
    wait_for_file(gate)
    return "done"
