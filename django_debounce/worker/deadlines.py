"""The next deadline an idle worker waits for (issue #12 item 4; decision 83).

:func:`next_run_at` answers "when does the next READY job of these queues
become due?", so a worker with nothing claimable sleeps until then (capped by
its poll interval) instead of a fixed poll, and a job due later starts at its
``run_at``. Jobs already due are left out on purpose: a due job the claim did
not take is held back (a rate limit, a concurrency cap, an open breaker, a
dependency, a run of its key), and counting it would wake the worker at once,
again and again; those are seen at the next poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS

from ..models import Job

#: Rows read at most when the worker serves only some queues: the query walks READY
#: rows in ``run_at`` order and keeps the first of a served queue.
SCAN_LIMIT = 50


def next_run_at(
    now: datetime,
    *,
    within: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> datetime | None:
    """Return the earliest ``run_at`` after ``now`` and up to ``now + within`` of a READY job.

    Args:
        now: the instant (aware datetime).
        within: how far ahead to look (the caller's longest sleep, e.g. the
            poll interval): the query reads only READY rows due in
            ``(now, now + within]``.
        queues: queue names served; ``None`` or empty: every queue.
        using: database alias.

    Returns:
        That ``run_at``, or ``None`` when no READY job falls in the span.
        With ``queues``, at most :data:`SCAN_LIMIT` rows are read: when none
        of them is of a served queue, the last one's ``run_at`` is returned
        (no served job is due before it, so waking then is never late).

    One query, served by the claim index (``status``, ``-priority``, ``run_at``):
    its ``status = 'READY'`` prefix, the span filtered inside the index.
    """
    rows = (
        Job.objects.using(using)
        .filter(status=Job.Status.READY, run_at__gt=now, run_at__lte=now + within)
        .order_by("run_at")
    )
    if not queues:
        return rows.values_list("run_at", flat=True).first()
    served = set(queues)
    seen: list[tuple[datetime, str]] = list(rows.values_list("run_at", "queue")[:SCAN_LIMIT])
    for run_at, queue in seen:
        if queue in served:
            return run_at
    return seen[-1][0] if len(seen) == SCAN_LIMIT else None


__all__ = ["SCAN_LIMIT", "next_run_at"]
