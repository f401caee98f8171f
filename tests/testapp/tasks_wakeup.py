"""Tasks for the wake-up tests (names start with ``wake.``): each records when it started."""

from __future__ import annotations

import os

from django.utils import timezone

from django_debounce import task

from .models import CallLog
from .tasks_reliability import current_job_id


@task(name="wake.stamp")
def stamp(tag: str) -> None:
    """Record the instant this run started (``CallLog.started_at``), with the job id."""
    now = timezone.now()
    CallLog.objects.create(
        task="wake.stamp", key=tag, job_id=current_job_id(), pid=os.getpid(), started_at=now
    )
