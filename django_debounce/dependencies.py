"""Job dependencies (contract §6): a job runs only after every job it depends on succeeded.

A dependency that ends FAILED, SHED, CANCELLED or EXPIRED cancels its
dependents, transitively, in the caller's transaction. CANCELLED is a planned
outcome: no dead letter is written (§8).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS

from .models import Job, JobDependency

logger = logging.getLogger("django_debounce.dependencies")

Status = Job.Status

#: Terminal statuses that cancel a job's dependents (§6).
CANCELLING_STATUSES = frozenset({Status.FAILED, Status.SHED, Status.CANCELLED, Status.EXPIRED})


def cancel_dependents(
    job_ids: Iterable[int], *, now: datetime, using: str = DEFAULT_DB_ALIAS
) -> list[int]:
    """Cancel every READY job that depends, directly or transitively, on ``job_ids``.

    Call it inside the transaction that moved ``job_ids`` to a status in
    :data:`CANCELLING_STATUSES`, so the failure and the cancellations commit
    together. A dependent that is already RUNNING or finished is left alone
    (it cannot have started before its dependency succeeded, unless it was
    enqueued with a dependency that had already succeeded).

    Args:
        job_ids: primary keys of jobs that just ended without success.
        now: the ``finished_at`` written on the cancelled jobs (the package's
            one clock, ``timezone.now()``, §4.7).
        using: database alias.

    Returns:
        The primary keys of the jobs cancelled, breadth first.
    """
    cancelled: list[int] = []
    frontier = list(dict.fromkeys(job_ids))
    seen = set(frontier)
    while frontier:
        waiting = list(
            JobDependency.objects.using(using)
            .filter(dependency_id__in=frontier, job__status=Status.READY)
            .values_list("job_id", flat=True)
            .distinct()
        )
        waiting = [pk for pk in waiting if pk not in seen]
        if not waiting:
            break
        Job.objects.using(using).filter(pk__in=waiting, status=Status.READY).update(
            status=Status.CANCELLED,
            finished_at=now,
            window_key=None,
            unique_lock=None,
        )
        seen.update(waiting)
        cancelled.extend(waiting)
        frontier = waiting
    if cancelled:
        logger.info(
            "cancelled %d job(s) whose dependency did not succeed: %s",
            len(cancelled),
            cancelled,
            extra={"action": "cancel_dependents"},
        )
    return cancelled
