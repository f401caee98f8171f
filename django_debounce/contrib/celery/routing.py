"""Where the Celery executor publishes: its Celery app, each job's Celery queue, the publish.

Split from :mod:`django_debounce.contrib.celery.executor` so the hand-off's watch
(:mod:`django_debounce.contrib.celery.handoff_watch`) and the lease reclaim's
"never taken" line (:func:`log_handoff_not_taken`) can name the Celery queue a
hand-off went to without importing the scheduler. Celery is
imported lazily: importing this module needs no Celery.

Routing (decisions 89 and 153): a job's queue maps through
``DEBOUNCE_CELERY_QUEUES``; an unlisted ``"default"`` (the package's default
queue) goes to the app's ``task_default_queue`` (``"celery"`` unless the
project changed it), the queue a plain ``celery worker`` consumes; any other
unlisted queue keeps its name.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.dispatch import receiver
from django.utils.module_loading import import_string

from ... import databases
from ...conf import settings
from ...exceptions import ConfigurationError
from ...log_fields import job_fields
from ...models import Job
from ...run.leases import HANDOFF_PREFIX, handoff_not_taken

logger = logging.getLogger("django_debounce.celery")

#: The Celery task a hand-off publishes (registered by :mod:`django_debounce.contrib.celery.tasks`).
RUN_TASK = "django_debounce.run_job"
#: The package's default queue (``Job.queue``'s default): routed to Celery's default queue.
DEFAULT_QUEUE = "default"
#: Celery's own ``task_default_queue`` default, used when no app can be loaded to ask.
CELERY_DEFAULT_QUEUE = "celery"


def celery_app() -> Any:
    """Return the Celery app to publish with: ``DEBOUNCE_CELERY_APP``, else Celery's current app.

    Raises:
        ConfigurationError: Celery is not installed, or ``DEBOUNCE_CELERY_APP``
            does not import (check E029).
    """
    try:
        from celery import current_app
    except ImportError:  # pragma: no cover - the extra is missing
        raise ConfigurationError(
            "the Celery executor needs Celery: pip install 'django-debounce[celery]'."
        ) from None
    path = settings.celery_app
    if not path:
        return current_app._get_current_object()
    try:
        return import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"DEBOUNCE_CELERY_APP={path!r} does not import: {exc}; give the dotted path of your "
            "Celery app, e.g. 'proj.celery.app'."
        ) from exc


def celery_default_queue(app: Any = None) -> str:
    """Return the Celery app's ``task_default_queue`` (``"celery"`` when it cannot be read).

    Args:
        app: the Celery app; ``None``: :func:`celery_app` (a missing Celery or
            an app that does not import gives Celery's default, ``"celery"``).
    """
    if app is None:
        try:
            app = celery_app()
        except ConfigurationError:
            return CELERY_DEFAULT_QUEUE
    return str(getattr(app.conf, "task_default_queue", None) or CELERY_DEFAULT_QUEUE)


def celery_queue(queue: str, *, app: Any = None) -> str:
    """Return the Celery queue a job of debounce queue ``queue`` is published to (decisions 89, 153).

    ``DEBOUNCE_CELERY_QUEUES[queue]`` when listed; else, for ``"default"``,
    the app's ``task_default_queue`` (normally ``"celery"``: what a plain
    ``celery worker`` consumes); else the same name.

    Args:
        queue: the job's queue.
        app: the Celery app publishing (``None``: :func:`celery_app`); read
            only for an unlisted ``"default"``.
    """
    mapping = settings.celery_queues
    if queue in mapping:
        return mapping[queue]
    if queue == DEFAULT_QUEUE:
        return celery_default_queue(app)
    return queue


def publish(
    jobs: Iterable[Job],
    *,
    app: Any = None,
    stopping: threading.Event | None = None,
    unpublished: list[Job] | None = None,
) -> tuple[int, int]:
    """Publish one ``django_debounce.run_job`` message per handed-off job; return (sent, failed).

    Each message: argument the job id (and its database alias when it is not the
    router's default: :func:`~django_debounce.contrib.celery.routing.message_args`),
    task id ``str(job.pk)`` (so Flower and ``AsyncResult`` show the job), no ETA (a job is never parked in the
    broker, so no visibility timeout redelivers it early), queue
    :func:`celery_queue`. Call it after the hand-off claim committed. A
    publish that raises is logged (action ``publish_error``) and counted; that
    job waits for its hand-off lease to lapse and is handed off again.

    Args:
        jobs: the handed-off jobs.
        app: the Celery app (default :func:`celery_app`).
        stopping: once set (the dispatcher's SIGTERM), a publish retrying
            through a broker outage gives up at its next retry
            (``task_publish_retry_policy`` otherwise applies), and the jobs not
            yet published are left, counted as failed, to their hand-off lease
            (decision 160): stopping takes about one retry interval, not one
            failing publish per job.
        unpublished: when given, receives the jobs a stop left unpublished (no
            publish of theirs was tried, so no message of theirs exists): the
            dispatcher puts them back to READY at once (decision 169) instead of
            leaving them to their hand-off lease.

    Raises:
        ConfigurationError: ``app`` is ``None`` and no Celery app loads.
    """
    app = app if app is not None else celery_app()
    policy = {"errback": _give_up_when(stopping)} if stopping is not None else None
    sent = failed = 0
    jobs = list(jobs)
    for index, job in enumerate(jobs):
        if stopping is not None and stopping.is_set():
            failed += len(jobs) - index
            logger.info(
                "stopping: %d handed-off job(s) not published; %s",
                len(jobs) - index,
                "they go back to READY"
                if unpublished is not None
                else "each is handed off again once its hand-off lease lapses",
                extra={"action": "publish_stopped"},
            )
            if unpublished is not None:
                unpublished.extend(jobs[index:])
            break
        try:
            app.send_task(
                RUN_TASK,
                args=message_args(job),
                task_id=str(job.pk),
                queue=celery_queue(job.queue, app=app),
                retry_policy=policy,
            )
        except Exception:
            failed += 1
            logger.exception(
                "could not publish job %s (%s) to Celery; it is handed off again once its "
                "hand-off lease lapses",
                job.pk,
                job.task_name,
                extra={"action": "publish_error", "job_id": job.pk},
            )
        else:
            sent += 1
    return sent, failed


def message_args(job: Job) -> list[object]:
    """Return a ``run_job`` message's arguments: the job id, and its database when not the default.

    The database is named only when it is not the router's choice for ``Job`` without
    hints (:func:`django_debounce.databases.default`), so a one-database project's
    messages stay ``[job_id]``, as before decision 224.
    """
    alias = job._state.db or databases.default()
    return [job.pk] if alias == databases.default() else [job.pk, alias]


def _give_up_when(stopping: threading.Event) -> Any:
    """Return a kombu retry ``errback`` that re-raises the broker's error once ``stopping`` is set."""

    def errback(exc: BaseException, interval: float) -> None:
        if stopping.is_set():
            raise exc

    return errback


__all__ = [
    "CELERY_DEFAULT_QUEUE",
    "DEFAULT_QUEUE",
    "RUN_TASK",
    "message_args",
    "celery_app",
    "celery_default_queue",
    "celery_queue",
    "publish",
]


@receiver(
    handoff_not_taken, dispatch_uid="django_debounce.contrib.celery.routing.handoff_not_taken"
)
def log_handoff_not_taken(sender: object, *, job: Job, **kwargs: Any) -> None:
    """Log a hand-off no Celery worker took within its lease, naming the Celery queue it went to.

    Receives :data:`django_debounce.run.leases.handoff_not_taken` (sent by the
    lease reclaim, which hands the job off again); logged on the worker's
    logger, as the reclaim's other lines are.
    """
    logging.getLogger("django_debounce.worker").warning(
        "job %s (%s) was handed off by %s and never taken: no Celery worker consumed Celery "
        "queue %r within the hand-off lease (no worker on that queue, workers stopped or "
        "saturated, or the message lost); handed off again, its attempt not counted",
        job.pk,
        job.task_name,
        job.worker_id.removeprefix(HANDOFF_PREFIX),
        celery_queue(job.queue),
        extra=job_fields(job, action="reclaim", outcome="requeued"),
    )
