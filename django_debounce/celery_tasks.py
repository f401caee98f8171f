"""The Celery tasks of the Celery executor: run a handed-off job, and one dispatch round for beat.

Registered with ``@shared_task`` (every Celery app of the process gets them)
when Django loads the app and Celery is installed
(:meth:`~django_debounce.apps.DjangoDebounceConfig.ready`), so a project's
``celery -A proj worker`` knows them without ``autodiscover_tasks``
(issue #10, docs/howto/celery.md).
"""

from __future__ import annotations

import logging

from celery import shared_task

from . import celery_executor
from .exceptions import JobFailedError
from .job_ids import parse_id

logger = logging.getLogger("django_debounce.celery")


@shared_task(name=celery_executor.RUN_TASK, throws=(JobFailedError,))
def run_job(*args: object, **kwargs: object) -> object:
    """Run the handed-off job whose id is the one argument (:func:`~django_debounce.celery_executor.run_handed_off`).

    The message's task id is the job id. A duplicate, late or stale message is a
    logged no-op, and so is a hand-crafted message whose arguments are not one
    job id (one ERROR line, action ``bad_message``). What Celery records
    (decision 138, docs/howto/celery.md "What Flower and AsyncResult show"):

    * SUCCESS with the job's stored result: the job succeeded;
    * SUCCESS with ``None``: the attempt failed and a retry is scheduled (the
      job is READY again), or the message was a no-op;
    * FAILURE with :class:`~django_debounce.exceptions.JobFailedError`: this
      attempt ended the job FAILED (dead letter written). It is in
      ``throws``, so the worker logs it without a traceback; the outcome is
      written before it is raised, and a redelivered message is a no-op, so
      no ``acks_late``/``acks_on_failure_or_timeout`` setting changes the job.
    """
    job_id = _job_id(args, kwargs)
    if job_id is None:
        return None
    return celery_executor.run_handed_off(job_id)


def _job_id(args: tuple[object, ...], kwargs: dict[str, object]) -> int | None:
    """Return the job id a ``run_job`` message carries, or log why it carries none and return ``None``."""
    value = args[0] if len(args) == 1 and not kwargs else kwargs.get("job_id", args)
    if len(args) + len(kwargs) == 1 and (job_id := parse_id(value)) is not None:
        return job_id
    logger.error(
        "ignored a %s message with args=%s kwargs=%s: it takes one job id "
        "(an integer, 1 to 2**63 - 1, or its ASCII decimal digits); "
        "the dispatcher publishes these, a hand-made message must too",
        celery_executor.RUN_TASK,
        _shown(list(args)),
        _shown(kwargs),
        extra={"action": "bad_message"},
    )
    return None


def _shown(value: object) -> str:
    """Return ``repr(value)`` cut to 200 characters; a number too long for ``repr`` is named instead."""
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return "<a value holding a number too long to print>"
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


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
