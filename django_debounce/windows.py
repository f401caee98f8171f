"""Operator actions on open debounce windows (contract §4.1, §9): run now, cancel.

Both act only on jobs that are still open windows (READY and never claimed,
``window_key IS NOT NULL``) at the moment of the write. The rows are locked
and the change is a conditional ``UPDATE … WHERE status = 'READY' AND
window_key IS NOT NULL``, so a job that a worker claimed meanwhile (even a
microsecond before) is left untouched and reported as refused: a claimed job
is never changed (§4.5).

Used by the admin's "Run now" and "Cancel" actions; callable from code too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Least
from django.utils import timezone

from .dependencies import cancel_dependents
from .models import Job

logger = logging.getLogger("django_debounce.windows")

Status = Job.Status


@dataclass(frozen=True)
class WindowActionResult:
    """What a window action did to the jobs it was given."""

    done: list[int] = field(default_factory=list)
    """Primary keys of the open windows acted on, ascending."""
    refused: list[int] = field(default_factory=list)
    """Primary keys that were not open windows at the write (claimed meanwhile,
    finished, or missing), ascending."""
    cancelled_dependents: list[int] = field(default_factory=list)
    """``cancel()`` only: dependents cancelled with the windows (§6), breadth first."""


def _ids(job_ids: Iterable[int]) -> list[int]:
    ids: list[int] = []
    for value in job_ids:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"job ids must be ints (primary keys of Job rows), got {value!r}; "
                "pass e.g. [job.pk for job in jobs]."
            )
        ids.append(value)
    return sorted(set(ids))


def _lock_open(ids: list[int], using: str) -> list[int]:
    """Lock the rows of ``ids`` that are open windows; return their keys (in a transaction).

    On PostgreSQL, ``SELECT … FOR UPDATE`` waits for a claim in flight and then
    re-checks the ``WHERE`` on the claimed row version, so a job claimed
    meanwhile drops out. SQLite's IMMEDIATE transactions serialize writers.
    """
    qs = Job.objects.using(using).open_windows().filter(pk__in=ids).order_by("pk")
    if connections[using].features.has_select_for_update:
        qs = qs.select_for_update()
    return list(qs.values_list("pk", flat=True))


def run_now(
    job_ids: Iterable[int], *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> WindowActionResult:
    """Make the given open windows due now: ``run_at = min(run_at, now)``.

    The window stays open (§4.1: open until first claimed, also while due), so
    a call arriving before a worker claims it still joins it; its ceiling is
    unchanged. A window already due keeps its ``run_at`` (its place in line).

    Args:
        job_ids: primary keys (ints) of ``Job`` rows, any order, duplicates ignored.
        now: the new deadline, an aware datetime; default ``timezone.now()``
            (the package's one clock, §4.7).
        using: database alias.

    Returns:
        :class:`WindowActionResult`: ``done`` the windows moved (or already
        due), ``refused`` the ids that were not open windows at the write —
        claimed by a worker meanwhile, finished, or no such row.

    Raises:
        TypeError: an id is not an int (nothing is written).
    """
    ids = _ids(job_ids)
    now = now or timezone.now()
    with transaction.atomic(using=using):
        open_ids = _lock_open(ids, using)
        if open_ids:
            Job.objects.using(using).filter(
                pk__in=open_ids, status=Status.READY, window_key__isnull=False
            ).update(run_at=Least("run_at", Value(now, output_field=DateTimeField())))
    result = WindowActionResult(done=open_ids, refused=sorted(set(ids) - set(open_ids)))
    if open_ids:
        logger.info(
            "run now: %d open window(s) made due: %s",
            len(open_ids),
            open_ids,
            extra={"action": "window_run_now"},
        )
    return result


def cancel(
    job_ids: Iterable[int], *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> WindowActionResult:
    """Cancel the given open windows: they end CANCELLED and never run.

    CANCELLED is a planned outcome (§8): no dead letter and no signal. The
    window closes (``window_key`` and ``unique_lock`` cleared), so the key's
    next call opens a new window. Jobs depending on a cancelled window are
    cancelled too, transitively, in the same transaction (§6).

    Args:
        job_ids: primary keys (ints) of ``Job`` rows, any order, duplicates ignored.
        now: the ``finished_at`` written, an aware datetime; default ``timezone.now()``.
        using: database alias.

    Returns:
        :class:`WindowActionResult`: ``done`` the windows cancelled, ``refused``
        the ids that were not open windows at the write (claimed by a worker
        meanwhile, finished, or no such row), ``cancelled_dependents`` the
        dependents cancelled with them.

    Raises:
        TypeError: an id is not an int (nothing is written).
    """
    ids = _ids(job_ids)
    now = now or timezone.now()
    dependents: list[int] = []
    with transaction.atomic(using=using):
        open_ids = _lock_open(ids, using)
        if open_ids:
            Job.objects.using(using).filter(
                pk__in=open_ids, status=Status.READY, window_key__isnull=False
            ).update(status=Status.CANCELLED, finished_at=now, window_key=None, unique_lock=None)
            dependents = cancel_dependents(open_ids, now=now, using=using)
    if open_ids:
        logger.info(
            "cancelled %d open window(s): %s",
            len(open_ids),
            open_ids,
            extra={"action": "window_cancel"},
        )
    return WindowActionResult(
        done=open_ids,
        refused=sorted(set(ids) - set(open_ids)),
        cancelled_dependents=dependents,
    )
