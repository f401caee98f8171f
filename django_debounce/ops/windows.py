"""Operator actions on waiting jobs (contract §4.1, §9): run now, cancel.

Both act on jobs that are READY at the moment of the write: open debounce
windows, and equally jobs that are not windows (a countdown/eta job, a job
waiting for its retry's backoff, a job held back by a circuit breaker, a
concurrency cap or a rate limit). The rows are locked and the change is a
conditional ``UPDATE … WHERE status = 'READY'``, so a job that a worker
claimed meanwhile (even a microsecond before) is left untouched and reported
as refused: a claimed job is never changed (§4.5). With
``only_open_windows=True`` (the admin's "Open windows" page) they act only on
jobs that are still open windows (``window_key IS NOT NULL``).

Used by the admin's "Run now" and "Cancel" actions; callable from code too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from .. import lifecycle
from ..job_ids import storable_ids
from ..log_fields import jobs_fields
from ..models import Job

logger = logging.getLogger("django_debounce.windows")

Status = Job.Status


@dataclass(frozen=True)
class WindowActionResult:
    """What a run-now or cancel did to the jobs it was given (all lists ascending)."""

    done: list[int] = field(default_factory=list)
    """Primary keys of the READY jobs acted on (open windows or not)."""
    refused: list[int] = field(default_factory=list)
    """Every primary key not acted on: the union of :attr:`running`, :attr:`finished`,
    :attr:`not_window` and :attr:`missing`."""
    cancelled_dependents: list[int] = field(default_factory=list)
    """``cancel()`` only: dependents cancelled with the jobs (§6), breadth first."""
    running: list[int] = field(default_factory=list)
    """Refused: RUNNING at the write (a worker claimed it meanwhile)."""
    finished: dict[int, str] = field(default_factory=dict)
    """Refused: already finished, id → its status (``"SUCCESSFUL"``, ``"CANCELLED"``, …)."""
    not_window: list[int] = field(default_factory=list)
    """Refused with ``only_open_windows=True``: READY but no longer an open window (it was
    claimed meanwhile and now waits for a retry)."""
    missing: list[int] = field(default_factory=list)
    """Refused: no such row."""


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


def _lock_ready(ids: list[int], using: str, only_open_windows: bool) -> list[int]:
    """Lock the rows of ``ids`` that are READY (open windows only, if asked); return their keys.

    Call it in a transaction. On PostgreSQL, ``SELECT … FOR UPDATE`` waits
    for a claim in flight and then re-checks the ``WHERE`` on the claimed row
    version, so a job claimed meanwhile drops out. SQLite's IMMEDIATE
    transactions serialize writers.
    """
    # An id past the 64-bit range names no row (and SQLite cannot even bind it): refused.
    ids = storable_ids(ids)
    qs = Job.objects.using(using).ready().filter(pk__in=ids)
    if only_open_windows:
        qs = qs.filter(window_key__isnull=False)
    qs = qs.order_by("pk")
    if connections[using].features.has_select_for_update:
        qs = qs.select_for_update()
    return list(qs.values_list("pk", flat=True))


def _result(
    ids: list[int], done: list[int], using: str, dependents: list[int] | None = None
) -> WindowActionResult:
    """Build the result, sorting the refused ids by why (one query when any was refused)."""
    refused = sorted(set(ids) - set(done))
    statuses = dict(
        Job.objects.using(using).filter(pk__in=storable_ids(refused)).values_list("pk", "status")
        if refused
        else []
    )
    return WindowActionResult(
        done=done,
        refused=refused,
        cancelled_dependents=dependents or [],
        running=[pk for pk in refused if statuses.get(pk) == Status.RUNNING],
        finished={
            pk: statuses[pk]
            for pk in refused
            if statuses.get(pk) not in (None, Status.READY, Status.RUNNING)
        },
        not_window=[pk for pk in refused if statuses.get(pk) == Status.READY],
        missing=[pk for pk in refused if pk not in statuses],
    )


def run_now(
    job_ids: Iterable[int],
    *,
    now: datetime | None = None,
    only_open_windows: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> WindowActionResult:
    """Make the given READY jobs due now: ``run_at = min(run_at, max(now, last call))``.

    An open window stays open (§4.1: open until first claimed, also while
    due), so a call arriving before a worker claims it still joins it; its
    ceiling is unchanged. A job already due keeps its ``run_at`` (its place
    in line). A job waiting for a retry's backoff or an eta becomes due now.
    Run now bypasses nothing else: a dependency not yet successful, an
    earlier run of the same key, a circuit breaker, a concurrency cap and a
    rate limit still apply when a worker claims the job (§4.5, §6).

    Args:
        job_ids: primary keys (ints) of ``Job`` rows, any order, duplicates ignored.
        now: the new deadline, an aware datetime; default ``timezone.now()``
            (the package's one clock, §4.7). A job whose last call
            (``last_enqueued_at``) is later, a call this one waited for, is
            due at that call instead (decision 200).
        only_open_windows: act only on jobs that are still open windows
            (refuse other READY jobs, reported in ``not_window``).
        using: database alias.

    Returns:
        :class:`WindowActionResult`: ``done`` the jobs moved (or already due),
        ``refused`` the others, sorted by why: ``running`` (claimed by a worker
        meanwhile), ``finished``, ``not_window``, ``missing``.

    Raises:
        TypeError: an id is not an int (nothing is written).
    """
    ids = _ids(job_ids)
    now = now or timezone.now()
    with transaction.atomic(using=using):
        done = _lock_ready(ids, using, only_open_windows)
        if done:
            # A flush that waited for a call's lock comes after that call: never due before
            # the last call it found, so a deadline is never earlier than its window (200).
            at = Greatest(Value(now, output_field=DateTimeField()), "last_enqueued_at")
            Job.objects.using(using).ready().filter(pk__in=done).update(run_at=Least("run_at", at))
        result = _result(ids, done, using)
    if done:
        logger.info(
            "run now: %d job(s) made due: %s", len(done), done, extra={"action": "window_run_now"}
        )
    return result


def cancel(
    job_ids: Iterable[int],
    *,
    now: datetime | None = None,
    only_open_windows: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> WindowActionResult:
    """Cancel the given READY jobs: they end CANCELLED and never run (again).

    CANCELLED is a planned outcome (§8): no dead letter and no signal. An
    open window closes (``window_key`` and ``unique_lock`` cleared), so the
    key's next call opens a new window. Jobs depending on a cancelled job are
    cancelled too, transitively, in the same transaction (§6). A claimed
    (RUNNING) or finished job is never changed.

    Args:
        job_ids: primary keys (ints) of ``Job`` rows, any order, duplicates ignored.
        now: the ``finished_at`` written, an aware datetime; default ``timezone.now()``.
        only_open_windows: act only on jobs that are still open windows.
        using: database alias.

    Returns:
        :class:`WindowActionResult`: ``done`` the jobs cancelled, ``refused``
        the others sorted by why (``running``: claimed by a worker meanwhile;
        ``finished``; ``not_window``; ``missing``), ``cancelled_dependents``
        the dependents cancelled with them.

    Raises:
        TypeError: an id is not an int (nothing is written).
    """
    ids = _ids(job_ids)
    now = now or timezone.now()
    dependents: list[int] = []
    with transaction.atomic(using=using):
        done = _lock_ready(ids, using, only_open_windows)
        if done:
            dependents = lifecycle.cancel_ready(done, now=now, using=using)
        result = _result(ids, done, using, dependents)
    if done:
        logger.info(
            "cancelled %d job(s): %s",
            len(done),
            done,
            extra=jobs_fields(done, action="window_cancel", outcome="cancelled"),
        )
    return result
