"""Shedding (contract §6, §8): a job dropped by flow control ends SHED with a dead letter.

Two rules shed: a rate limit with ``on_excess="drop"`` (reason prefix
``shed:``, dead-letter metadata ``{"shed": True, ...}``) and CoDel (prefix
``codel:``, metadata ``{"codel": True, ...}``). A shed fires no signal, keeps
the job row with its own metadata, and cancels the job's dependents. The
auto-retry sweep never retries a shed entry; a manual retry may.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .dependencies import cancel_dependents
from .models import DeadLetter, Job

logger = logging.getLogger("django_debounce.shedding")

#: Dead-letter reason prefixes that the automatic retry sweep never retries (§8).
RESERVED_PREFIXES = ("shed:", "codel:", "unknown_task:")


def shed_job(
    job: Job,
    *,
    reason: str,
    metadata: dict[str, Any],
    now: datetime,
    using: str = DEFAULT_DB_ALIAS,
) -> DeadLetter | None:
    """Mark ``job`` SHED, write its dead letter and cancel its dependents.

    Call it inside the claim transaction that holds the job's row lock, while
    the job is still READY. No signal is sent (§9: none for a shed).

    Args:
        job: the READY job to drop.
        reason: the dead letter's reason; must start with ``"shed:"`` or
            ``"codel:"``.
        metadata: the dead letter's metadata; must hold ``"shed": True`` or
            ``"codel": True`` to match the prefix (§6).
        now: the time written as ``finished_at`` and the letter's ``created_at``.
        using: database alias.

    Returns:
        The dead letter, or ``None`` when the job was no longer READY (nothing
        written).

    Raises:
        ValueError: ``reason`` lacks a shed prefix.
    """
    if not reason.startswith(("shed:", "codel:")):
        raise ValueError(f"a shed reason must start with 'shed:' or 'codel:', got {reason!r}")
    updated = (
        Job.objects.using(using)
        .filter(pk=job.pk, status=Job.Status.READY)
        .update(
            status=Job.Status.SHED,
            finished_at=now,
            window_key=None,
            unique_lock=None,
        )
    )
    if not updated:
        return None
    job.status, job.finished_at, job.window_key, job.unique_lock = (
        Job.Status.SHED,
        now,
        None,
        None,
    )
    letter = DeadLetter.objects.using(using).create(
        job=job,
        task_name=job.task_name,
        queue=job.queue,
        args=job.args,
        kwargs=job.kwargs,
        reason=reason,
        metadata=metadata,
        created_at=now,
        retry_depth=DeadLetter.retry_depth_for(job, using=using),
    )
    cancel_dependents([job.pk], now=now, using=using)
    logger.info(
        "shed job %s (%s): %s",
        job.pk,
        job.task_name,
        reason,
        extra={"action": "shed", "job_id": job.pk},
    )
    return letter
