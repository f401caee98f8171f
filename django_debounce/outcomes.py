"""Outcome writes: how a claimed job ends or goes back (contract §6, §7, §8, §11).

Plain functions of a job (or job ids), a worker id, a time and a database
alias, so that any executor can call them, not only the built-in worker loop.
"""

from __future__ import annotations

import logging
from datetime import datetime

from .dependencies import cancel_dependents
from .models import Job

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status


def expire_jobs(ids: list[int], *, now: datetime, using: str) -> None:
    """End the jobs ``ids``, not started by their expiry, as EXPIRED; they never run (§6, §11).

    Call it inside the claim's transaction with the jobs locked. No dead letter
    (§8: a planned outcome); their dependents are cancelled in the same
    transaction (§11). ``now`` is the claim's clock, written as ``finished_at``.
    """
    _set_expired(ids, now=now, using=using)
    logger.info(
        "expired %d job(s) not started by their expiry: %s",
        len(ids),
        ids,
        extra={"action": "expire"},
    )


def _set_expired(ids: list[int], *, now: datetime, using: str) -> None:
    """The EXPIRED write: close the job, free its window and lock, cancel its dependents."""
    Job.objects.using(using).filter(pk__in=ids).update(
        status=Status.EXPIRED, finished_at=now, window_key=None, unique_lock=None
    )
    cancel_dependents(ids, now=now, using=using)
