"""Due jobs the claim finds past their expiry end EXPIRED, unrun (§6, §11).

The claim expires them in its own transaction, with the rows locked: expiring a
due job is part of claiming, so the claim does not reach into the outcomes of
runs (:mod:`django_debounce.run.outcomes`). A job claimed ahead that passes its
expiry before it starts is ended by the hand-over instead
(:func:`django_debounce.run.outcomes.expire_claimed`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from .. import lifecycle
from ..log_fields import jobs_fields

logger = logging.getLogger("django_debounce.worker")


def expire_jobs(ids: list[int], *, now: datetime, using: str) -> None:
    """End the jobs ``ids``, not started by their expiry, as EXPIRED; they never run (§6, §11).

    Call it inside the claim's transaction with the jobs locked. No dead letter
    (§8: a planned outcome); their dependents are cancelled in the same
    transaction (§11).

    Args:
        ids: primary keys of READY jobs the claim locked, each past ``expires_at``.
        now: the claim's clock (an aware datetime), written as ``finished_at``.
        using: database alias.

    Raises:
        DatabaseError: the write failed; the claim's transaction rolls back.
    """
    lifecycle.expire(ids, now=now, using=using)
    logger.info(
        "expired %d job(s) not started by their expiry: %s",
        len(ids),
        ids,
        extra=jobs_fields(ids, action="expire", outcome="expired"),
    )
