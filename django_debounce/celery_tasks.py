"""The Celery tasks of the Celery executor: run a handed-off job, and one dispatch round for beat.

Registered with ``@shared_task`` (every Celery app of the process gets them)
when Django loads the app and Celery is installed
(:meth:`~django_debounce.apps.DjangoDebounceConfig.ready`), so a project's
``celery -A proj worker`` knows them without ``autodiscover_tasks``
(issue #10, docs/howto/celery.md).
"""

from __future__ import annotations

from celery import shared_task

from . import celery_executor


@shared_task(name=celery_executor.RUN_TASK)
def run_job(job_id: int) -> object:
    """Run the handed-off job ``job_id`` (:func:`~django_debounce.celery_executor.run_handed_off`).

    The message's task id is the job id. A duplicate, late or stale message is a
    logged no-op. Returns the job's stored result (``None`` when it failed).
    """
    return celery_executor.run_handed_off(int(job_id))


@shared_task(name=celery_executor.DISPATCH_TASK, ignore_result=True)
def dispatch(limit: int = 1000, queues: list[str] | None = None) -> int:
    """Hand due jobs to Celery (:func:`~django_debounce.celery_executor.dispatch_due`); for Celery beat.

    Args:
        limit: most jobs handed off by this round.
        queues: debounce queues to dispatch; ``None``: every queue.

    Returns:
        How many jobs were handed off.
    """
    return celery_executor.dispatch_due(limit=int(limit), queues=queues)


__all__ = ["dispatch", "run_job"]
