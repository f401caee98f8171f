"""Warn within seconds about hand-offs no Celery worker takes (issue #17 item 11, decision 153).

A job handed to Celery waits for a worker under its hand-off lease
(``DEBOUNCE_CELERY_HANDOFF_LEASE``, 5 minutes by default); the lapse logs that
it was never taken (decision 140), but only after the whole lease. The
scheduler looks sooner: every :data:`CHECK_EVERY`, each dispatch round asks
which hand-offs are still ``handoff:``-held :data:`NOT_TAKEN_AFTER` after
they were handed off (the ``(status, lease_expires_at)`` index, one range),
and, for a Celery queue no worker took anything from meanwhile, logs one
WARNING line naming the queue. The lease still protects the jobs: nothing is
changed, and each job is named once per process.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from ...models import Job
from ...run.leases import HANDOFF_PREFIX

logger = logging.getLogger("django_debounce.celery")

#: How long a hand-off may wait for a Celery worker before the scheduler warns (at most half the lease).
NOT_TAKEN_AFTER = timedelta(seconds=10)
#: How often a process's dispatch rounds look for hand-offs nobody took.
CHECK_EVERY = timedelta(seconds=2)
#: Most hand-offs read per look.
LIMIT = 1000
#: Most job ids quoted in one line.
QUOTED = 5

#: The prefix of a Celery worker's run (``celery_executor.take_and_run``).
CELERY_PREFIX = "celery:"


class UntakenWatch:
    """One process's look-out for hand-offs not taken (what :func:`~django_debounce.contrib.celery.executor.dispatch_due` runs)."""

    def __init__(self) -> None:
        self._warned: set[int] = set()
        self._next: datetime | None = None

    def run_if_due(
        self, *, lease: timedelta, route: Callable[[str], str], using: str = DEFAULT_DB_ALIAS
    ) -> list[str]:
        """Run :meth:`check` if :data:`CHECK_EVERY` passed since the last look; return the lines logged."""
        now = timezone.now()
        if self._next is not None and now < self._next and now > self._next - 2 * CHECK_EVERY:
            return []
        self._next = now + CHECK_EVERY
        return self.check(lease=lease, route=route, using=using, now=now)

    def check(
        self,
        *,
        lease: timedelta,
        route: Callable[[str], str],
        using: str = DEFAULT_DB_ALIAS,
        now: datetime | None = None,
    ) -> list[str]:
        """Warn about hand-offs still not taken :data:`NOT_TAKEN_AFTER` after they were handed off.

        A hand-off's time is its lease's end minus ``lease`` (the hand-off
        lease, as the claim wrote it). Jobs are grouped by the Celery queue
        ``route`` maps their queue to; a group is left alone when a Celery
        worker took a job of one of its queues since the oldest of them was
        handed off (workers are there, only busy: the lease's lapse still
        reports a wait that long). Each job is named once per process.

        Args:
            lease: the hand-off lease (``DEBOUNCE_CELERY_HANDOFF_LEASE``).
            route: debounce queue → Celery queue
                (:func:`~django_debounce.contrib.celery.routing.celery_queue`).
            using: database alias.
            now: the time to check at (default: now).

        Returns:
            The WARNING lines logged (one per Celery queue nobody consumed).

        Raises:
            DatabaseError: the database failed (nothing is changed).
        """
        now = now or timezone.now()
        after = min(NOT_TAKEN_AFTER, lease / 2)
        rows = list(
            Job.objects.using(using)
            .filter(
                status=Job.Status.RUNNING,
                worker_id__startswith=HANDOFF_PREFIX,
                lease_expires_at__gt=now,
                lease_expires_at__lte=now - after + lease,
            )
            .order_by("lease_expires_at")
            .values_list("pk", "task_name", "queue", "lease_expires_at")[:LIMIT]
        )
        fresh = [row for row in rows if row[0] not in self._warned]
        self._warned = {row[0] for row in rows}  # forget jobs taken or lapsed since
        groups: dict[str, list[tuple[int, str, str, datetime]]] = defaultdict(list)
        for pk, task_name, queue, lease_end in fresh:
            if lease_end is not None:  # always set by the filter; for the type checker
                groups[route(queue)].append((pk, task_name, queue, lease_end))
        lines = []
        for celery_queue, jobs in groups.items():
            handed_at = jobs[0][3] - lease
            if _taken_since(sorted({row[2] for row in jobs}), handed_at, using=using):
                continue
            named = ", ".join(f"{pk} ({task})" for pk, task, _, _ in jobs[:QUOTED])
            more = f" and {len(jobs) - QUOTED} more" if len(jobs) > QUOTED else ""
            line = (
                f"{len(jobs)} job(s) handed off {after.total_seconds():g} s ago or more were "
                f"never taken: no Celery worker consumed Celery queue {celery_queue!r} (jobs "
                f"{named}{more}). Start a worker on it (celery -A <your app> worker -Q "
                f"{celery_queue}) or map the queue with DEBOUNCE_CELERY_QUEUES; the jobs stay "
                "handed off until their hand-off lease lapses, then are handed off again"
            )
            logger.warning(
                line,
                extra={
                    "action": "not_taken",
                    "celery_queue": celery_queue,
                    "job_ids": [pk for pk, *_ in jobs],
                },
            )
            lines.append(line)
        return lines


def _taken_since(queues: list[str], since: datetime, *, using: str) -> bool:
    """True when a Celery worker runs, or ran since ``since``, a job of one of ``queues``."""
    taken = Job.objects.using(using).filter(queue__in=queues, worker_id__startswith=CELERY_PREFIX)
    if taken.filter(status=Job.Status.RUNNING).exists():
        return True
    return taken.filter(finished_at__gte=since).exists()


__all__ = ["CHECK_EVERY", "NOT_TAKEN_AFTER", "UntakenWatch"]
