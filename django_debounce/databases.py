"""Which database a job is written to: Django's router, told the job's queue and task (decision 224).

Every write of a new job asks ``router.db_for_write(Job, queue=..., task_name=...)``:
a project's router (``DATABASE_ROUTERS``) can send each queue to a database of its own,
the Django way, and a router that ignores the hints (or none at all) keeps every job in
the one database it chooses for ``Job``, as before. Processes that serve jobs (the
built-in worker, the Celery dispatcher, the operators' commands) are given their
database (``--database``), as Django's own commands are; a Celery message names the
database of its job when it is not the router's choice without hints.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, router

from .models import Job


def for_job(queue: str, task_name: str) -> str:
    """Return the database alias a new job of ``task_name`` in ``queue`` is written to.

    Args:
        queue: the job's queue (after the call's and the task's options).
        task_name: the job's task name.

    Returns:
        The router's ``db_for_write(Job, queue=queue, task_name=task_name)``, or
        ``"default"`` when no router decides.
    """
    return router.db_for_write(Job, queue=queue, task_name=task_name) or DEFAULT_DB_ALIAS


def default() -> str:
    """Return the alias the router gives ``Job`` without hints (``"default"`` without a router).

    It is the database of every process not given one, and of a Celery message that
    names none (messages published before decision 224, or for a job of this database).
    """
    return router.db_for_write(Job) or DEFAULT_DB_ALIAS


__all__ = ["default", "for_job"]
