"""Cancel jobs whatever their state: a waiting one ends at once, a running one is asked to stop (decision 186).

:func:`cancel_jobs` is what ``Job.cancel()``, the admin's "Cancel" action on
jobs and ``manage.py debounce_cancel`` call. A READY job ends CANCELLED at once
(:func:`django_debounce.ops.windows.cancel`: never runs, no dead letter, its
dependents cancelled, §6, §8). A RUNNING job cannot be stopped from outside
its thread: it gets a durable mark, ``cancel_requested_at``, which its task
reads through its context (``context.cancel_requested``,
``context.checkpoint()``); an async task is cancelled by its watcher. The run
then ends CANCELLED (:mod:`django_debounce.run.cancelled_runs`). A task that
never looks runs to its end and ends as it would have (a success stays a
success); a failure after the request is not retried. A finished job is left
alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, transaction

from ..exceptions import CancelContentionError
from ..job_ids import storable_ids
from ..log_fields import jobs_fields
from ..models import Job
from ..validators import checked_now
from . import windows
from .contention import retrying

logger = logging.getLogger("django_debounce.windows")

Status = Job.Status

#: Rounds of cancel-then-mark when jobs move between READY and RUNNING meanwhile.
ROUNDS = 3


@dataclass(frozen=True)
class CancelResult:
    """What :func:`cancel_jobs` did to the jobs it was given (lists ascending)."""

    cancelled: list[int] = field(default_factory=list)
    """READY jobs ended CANCELLED (they never run)."""
    requested: list[int] = field(default_factory=list)
    """RUNNING jobs whose cancel is now requested (marked now or before)."""
    cancelled_dependents: list[int] = field(default_factory=list)
    """Dependents of the cancelled jobs, cancelled with them (§6)."""
    finished: dict[int, str] = field(default_factory=dict)
    """Left alone: already finished, id → status."""
    missing: list[int] = field(default_factory=list)
    """Left alone: no such row."""


def cancel_jobs(
    job_ids: Iterable[int], *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> CancelResult:
    """Cancel the jobs ``job_ids``: READY ones at once, RUNNING ones by request (decision 186).

    Args:
        job_ids: primary keys (ints) of ``Job`` rows, any order, duplicates ignored.
        now: the ``finished_at`` / ``cancel_requested_at`` written, an aware
            datetime; default ``timezone.now()``.
        using: database alias.

    Returns:
        :class:`CancelResult`.

    Raises:
        TypeError: an id is not an int (nothing is written).
        ConfigurationError: ``now`` is not an aware datetime (nothing is written).
        CancelContentionError: lock contention inside the caller's transaction, or
            after ``ops.contention.ATTEMPTS`` attempts (nothing is written).
    """
    ids = windows._ids(job_ids)
    now = checked_now(now, "cancel")

    def attempt() -> tuple[list[int], list[int], set[int], dict[int, str]]:
        cancelled: list[int] = []
        dependents: list[int] = []
        requested: set[int] = set()
        left = storable_ids(ids)
        with transaction.atomic(using=using):
            for _round in range(ROUNDS):
                result = windows.cancel(left, now=now, using=using)
                cancelled += result.done
                dependents += result.cancelled_dependents
                if not result.running:
                    break
                running = Job.objects.using(using).running().filter(pk__in=result.running)
                running.filter(cancel_requested_at__isnull=True).update(cancel_requested_at=now)
                requested.update(
                    running.filter(cancel_requested_at__isnull=False).values_list("pk", flat=True)
                )
                # A run that ended meanwhile with a retry is READY again: cancel it next round.
                left = [pk for pk in result.running if pk not in requested]
                if not left:
                    break
            statuses = dict(
                Job.objects.using(using)
                .filter(pk__in=storable_ids(ids))
                .exclude(pk__in=[*cancelled, *requested])
                .values_list("pk", "status")
            )
        return cancelled, dependents, requested, statuses

    # A deadlock with a claim (MariaDB) rolled the attempt back: run it again (decision 210).
    cancelled, dependents, requested, statuses = retrying(
        attempt, using, "cancel", CancelContentionError
    )
    if requested:
        logger.info(
            "cancel requested for %d running job(s): %s",
            len(requested),
            sorted(requested),
            extra=jobs_fields(sorted(requested), action="cancel_requested", outcome="requested"),
        )
    return CancelResult(
        cancelled=sorted(cancelled),
        requested=sorted(requested),
        cancelled_dependents=dependents,
        finished=dict(sorted(statuses.items())),
        missing=[
            pk for pk in ids if pk not in statuses and pk not in requested and pk not in cancelled
        ],
    )


__all__ = ["CancelResult", "cancel_jobs"]
