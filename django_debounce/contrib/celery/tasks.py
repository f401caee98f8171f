"""The Celery tasks of the Celery executor: run a handed-off job, and one dispatch round for beat.

Registered with ``@shared_task`` (every Celery app of the process gets them)
when Django loads the app and Celery is installed
(:meth:`~django_debounce.apps.DjangoDebounceConfig.ready`), so a project's
``celery -A proj worker`` knows them without ``autodiscover_tasks``
(issue #10, docs/howto/celery.md).
"""

from __future__ import annotations

import logging

from celery import current_task, shared_task
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, Retry
from celery.signals import worker_process_shutdown, worker_shutdown
from django.db import connections

from ... import databases
from ...exceptions import JobFailedError
from ...job_ids import parse_id
from ...models import Job
from ...signals import job_progress
from . import executor as celery_executor
from .batched_successes import process_successes
from .kept_connection import kept_connection
from .progress_state import store_progress_state

logger = logging.getLogger("django_debounce.celery")

# A running job's progress becomes its Celery task's PROGRESS state (decision 204).
job_progress.connect(
    store_progress_state, sender=Job, dispatch_uid="django_debounce.celery.progress"
)


# A warm shutdown writes the successes still waiting for their batched write (decision 216).
worker_process_shutdown.connect(process_successes.flush_all, weak=False)
worker_shutdown.connect(process_successes.flush_all, weak=False)


@shared_task(name=celery_executor.RUN_TASK, throws=(JobFailedError,))
def run_handoff_message(*args: object, **kwargs: object) -> object:
    """The Celery task ``django_debounce.run_job``: run the handed-off job the message names.

    The message's one argument is the job id; the job is taken and run by
    :func:`~django_debounce.contrib.celery.executor.take_and_run`. (Named apart from
    :func:`django_debounce.run.execution.run_job`, which every executor's run goes
    through; the Celery task's name stays ``django_debounce.run_job``.)

    The message's task id is the job id, so every hand-off of one job shares
    one Celery result. What Celery records (decisions 138 and 152,
    docs/howto/celery.md "What Flower and AsyncResult show"):

    * SUCCESS with the job's stored result: the job succeeded;
    * RETRY with :class:`~django_debounce.exceptions.JobRetryError`: the job
      is READY again (this attempt failed and a retry is scheduled, or its
      task is not known here yet). Raised as Celery's ``Retry`` without
      publishing anything: the scheduler hands the job off again. Result
      backends let a later state replace RETRY, never a SUCCESS;
    * FAILURE with :class:`~django_debounce.exceptions.JobFailedError`: this
      attempt ended the job FAILED (dead letter written). It is in
      ``throws``, so the worker logs it without a traceback;
    * nothing (Celery's ``Ignore``): the message had nothing to take (a
      duplicate, late or stale message, or a hand-crafted one whose
      arguments are not one job id; an INFO ``noop`` or ERROR
      ``bad_message`` line), or its run was late and discarded. The result
      stays what the job's own attempts wrote, so a duplicate never hides
      them.

    The outcome is written before anything is raised, and a redelivered
    message is a no-op, so no ``acks_late``/``acks_on_failure_or_timeout``
    setting changes the job. When no result backend stores this task's
    results (none configured, or ``ignore_result``), a plain success is
    written in a batch with others within ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``
    (:mod:`~django_debounce.contrib.celery.batched_successes`, decision 215):
    the task returns first, the job row follows within the interval; with a
    result backend it is written before the task returns, as every other
    outcome is. The take, the run and the outcome use a
    connection this worker thread keeps across jobs, which Celery's Django
    fixup does not close around each task
    (:func:`~django_debounce.contrib.celery.kept_connection.kept_connection`,
    decision 184).
    """
    message = _job_and_database(args, kwargs)
    if message is None:
        raise Ignore()
    job_id, using = message
    with kept_connection(using):
        successes = None if _result_stored() else process_successes.batch_for(using)
        job = celery_executor.take_and_run(job_id, using=using, successes=successes).job
    if job is None:
        raise Ignore()
    if successes is not None:
        waiting, stored = process_successes.holds(job, using)
        if waiting:  # written within DEBOUNCE_SUCCESS_FLUSH_INTERVAL (decision 215)
            return stored
    if job.status == Job.Status.SUCCESSFUL:
        return job.result
    if job.status == Job.Status.FAILED:
        raise celery_executor.failed_error(job)
    if job.status == Job.Status.READY:
        error = celery_executor.retry_error(job)
        raise Retry(str(error), exc=error, when=job.run_at)
    raise Ignore()  # a late run: its outcome was discarded, the job is another run's


def _result_stored() -> bool:
    """True when a result backend stores this message's result (then its success is written at once).

    The backend's SUCCESS is final (a later state never replaces it, decision 152), so
    it must never precede the job row's: a run kept for a batched write and then lost
    with its process would run again under a SUCCESS already stored (decision 215).
    """
    task = current_task
    if task is None:
        return False
    explicit = getattr(task.request, "__dict__", {}).get("ignore_result")
    ignored = task.ignore_result if explicit is None else explicit
    return not ignored and not isinstance(task.backend, DisabledBackend)


def _job_and_database(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[int, str] | None:
    """Return the job id and database alias a ``run_job`` message carries, or log why not.

    A message is ``[job_id]`` (the job is in :func:`django_debounce.databases.default`)
    or ``[job_id, alias]`` (decision 224: the dispatcher of another database published it).
    """
    using = databases.default()
    if len(args) == 2 and not kwargs and isinstance(alias := args[1], str):
        if alias not in connections.settings:
            logger.error(
                "ignored a %s message for job %s of database %s: not an alias of this "
                "process's DATABASES %s; give every Celery worker the DATABASES of the "
                "dispatchers",
                celery_executor.RUN_TASK,
                _shown(args[0]),
                _shown(alias),
                sorted(connections.settings),
                extra={"action": "bad_message"},
            )
            return None
        args, using = args[:1], alias
    value = args[0] if len(args) == 1 and not kwargs else kwargs.get("job_id", args)
    if len(args) + len(kwargs) == 1 and (job_id := parse_id(value)) is not None:
        return job_id, using
    logger.error(
        "ignored a %s message with args=%s kwargs=%s: it takes one job id "
        "(an integer, 1 to 2**63 - 1, or its ASCII decimal digits) and optionally "
        "the job's database alias; the dispatcher publishes these, a hand-made message must too",
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
def dispatch(
    limit: int = 1000, queues: list[str] | None = None, database: str | None = None
) -> int:
    """Hand due jobs to Celery (:func:`~django_debounce.contrib.celery.executor.dispatch_due`); for Celery beat.

    Args:
        limit: most jobs handed off by this round.
        queues: debounce queues to dispatch; ``None``: every queue.
        database: the database alias whose jobs to dispatch; ``None``: the router's
            choice for ``Job`` (decision 224: one beat entry per database).

    Returns:
        How many jobs were handed off.
    """
    return celery_executor.dispatch_due(limit=int(limit), queues=queues, using=database)


__all__ = ["dispatch", "run_handoff_message"]
