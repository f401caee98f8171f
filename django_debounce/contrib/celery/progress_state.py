"""A handed-off job's progress as Celery's ``PROGRESS`` state (decision 204).

Each progress write of a job run by the Celery task ``django_debounce.run_job``
(:data:`~django_debounce.signals.job_progress`, at most once a second per run)
is also stored as that task's state through ``Task.update_state``: state
``"PROGRESS"``, meta ``{"done", "total", "percent", "note"}``. The task id is
the job id, so ``AsyncResult(str(job.pk)).info`` reads it while the job runs;
the job's SUCCESS, RETRY or FAILURE replaces it when the run ends. Nothing is
stored when the task ignores its result or the app has no result backend.
Connected when :mod:`django_debounce.contrib.celery.tasks` is imported.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_task
from celery.backends.base import DisabledBackend

from ...progress import Progress
from .routing import RUN_TASK

logger = logging.getLogger("django_debounce.celery")

#: The Celery state a running job's progress is stored under (Celery's custom-state convention).
PROGRESS_STATE = "PROGRESS"


def store_progress_state(sender: Any, *, job: Any, progress: Progress, **_: Any) -> None:
    """Receiver of ``job_progress``: store ``progress`` as the running Celery task's state.

    Does nothing outside the Celery task ``django_debounce.run_job`` for this job
    (the built-in worker, another task), when the task ignores its result, or
    without a result backend.
    """
    task = current_task
    if task is None or getattr(task, "name", None) != RUN_TASK:
        return
    request = task.request
    if request.id != str(job.pk) or request.ignore_result or task.ignore_result:
        return
    if isinstance(task.backend, DisabledBackend):
        return
    task.update_state(task_id=request.id, state=PROGRESS_STATE, meta=progress.as_dict())


__all__ = ["PROGRESS_STATE", "store_progress_state"]
