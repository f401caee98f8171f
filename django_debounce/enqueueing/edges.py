"""The leading and both edges of a debounce window (issue #21 item 2, decision 180).

A task declared with ``debounce_edge="leading"`` or ``"both"`` runs the first
call of a burst at once. Its window cannot be the pending job row alone, as a
trailing window is: the leading job is due at once and claimed quickly (the
claim clears its ``window_key``), while the burst must stay open after it to
swallow (leading) or gather (both) later calls. So the burst is read from the
key's rows whose ceiling has not passed (``key_hash``, ``max_run_at > now``),
newest first:

* the **leading job** ``L`` opens the burst: due at once (``run_at =
  opened_at = now``), ceiling ``now + max_wait``, the first call's payload,
  never changed once claimed except for the burst's bookkeeping
  (``enqueue_count``, ``last_enqueued_at``) that a swallowed call of a
  *leading* burst writes — never its payload, status or deadline;
* the **trailing job** ``T`` (*both* only) is created by the burst's second
  call, with the burst's ``opened_at`` and ceiling; it takes the key's
  ``window_key`` from ``L`` and is slid as a trailing window is (§4.2).

The burst is open at ``now`` while its newest row did not end without
success (FAILED, CANCELLED, EXPIRED, SHED: the calls it swallowed were not
served, so the next call opens a new burst) and ``now < min(last call +
window, ceiling)``.
Every write locks the burst's rows first (``SELECT … FOR UPDATE``); a call that
inserts (a burst's leading or trailing job) reads them again after its insert,
and if another call opened a burst meanwhile (a locking read that waited for a
lock returns the rows of its statement's snapshot, on PostgreSQL) it is rolled
back and tried again (:class:`EdgeRaceError`), so racing calls never run two
leading jobs, or a trailing job of a burst already closed, for one key (§4.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import F

from ..models import Job
from ..options import Plan
from . import upsert
from .rows import apply_slide, new_job

Status = Job.Status
#: Statuses of a job that ended without success: its burst is closed with it.
CLOSING = frozenset({Status.FAILED, Status.CANCELLED, Status.EXPIRED, Status.SHED})


class EdgeRaceError(Exception):
    """Another call opened the key's burst while this one did: roll back and try again."""


def burst_rows(key_hash: str, now: datetime, db: str, *, lock: bool = True) -> list[Job]:
    """Return the key's two newest rows whose ceiling is after ``now``, newest first (locked)."""
    qs = Job.objects.using(db).filter(key_hash=key_hash, max_run_at__gt=now).order_by("-pk")
    if lock:
        qs = qs.select_for_update()
    return list(qs[:2])


def open_burst(rows: Sequence[Job], window: timedelta, now: datetime) -> list[Job]:
    """Return the rows of the burst open at ``now`` among ``rows`` (newest first), else ``[]``.

    The newest row carries the burst: its ``last_enqueued_at`` is the burst's
    last call and its ``max_run_at`` the burst's ceiling. The second row
    belongs to the same burst when it has the same ``opened_at`` and ceiling
    (the leading job of a *both* burst whose trailing job is the newest).
    """
    if not rows:
        return []
    newest = rows[0]
    if newest.status in CLOSING or now >= closes_at(newest, window):
        return []
    same = [
        job
        for job in rows[1:]
        if job.opened_at == newest.opened_at and job.max_run_at == newest.max_run_at
    ]
    return [newest, *same]


def closes_at(newest: Job, window: timedelta) -> datetime:
    """Return when the burst whose newest row is ``newest`` closes.

    ``min(last call + window, ceiling)``: the last call is the row's
    ``last_enqueued_at``, the ceiling its ``max_run_at`` (the burst's).
    """
    assert newest.max_run_at is not None
    return min(newest.last_enqueued_at + window, newest.max_run_at)


def write_edge(plan: Plan, now: datetime, db: str) -> Job:
    """Write one call of a leading or both task inside the caller's transaction (decision 180).

    Args:
        plan: a debounced call of a task whose ``debounce_edge`` is ``"leading"``
            or ``"both"`` (``plan.window_key`` set).
        now: the call's instant (aware, §4.7).
        db: the database alias, inside a transaction or savepoint that an
            :class:`EdgeRaceError` rolls back.

    Returns:
        The job after the call, ``outcome`` set: ``"created"`` for a call that
        opened a burst (its leading job) or that created the burst's trailing
        job; ``"debounced"`` for a call swallowed by a leading burst (the
        leading job, in whatever status it is) or gathered into a trailing job.

    Raises:
        EdgeRaceError: another call opened a burst of the key meanwhile (retry).
        ConfigurationError: the ``debounce_merge`` function returned no call.
    """
    assert plan.window_key is not None and plan.window is not None
    rows = burst_rows(plan.window_key, now, db)
    # A call that waited for the key's locks comes after the calls it waited for: its
    # instant is at least theirs, or its trailing job would be due before its burst opened.
    now = max([now, *(t for row in rows for t in (row.opened_at, row.last_enqueued_at) if t)])
    burst = open_burst(rows, plan.window, now)
    if not burst:
        return _open(plan, now, db)
    newest = burst[0]
    if plan.edge == "leading":
        # Swallowed: the burst's quiet period slides; the leading job's payload and
        # deadline stay as they are, whether it is pending, running or done.
        Job.objects.using(db).filter(pk=newest.pk).update(
            enqueue_count=F("enqueue_count") + 1, last_enqueued_at=now
        )
        newest.enqueue_count += 1
        newest.last_enqueued_at = now
        newest.outcome = "debounced"
        return newest
    if len(burst) > 1 and newest.window_key is not None:
        # The trailing job gathers the call, as a trailing window does (§4.2).
        newest.save(update_fields=apply_slide(newest, plan, now), using=db)
        newest.outcome = "debounced"
        return newest
    # The burst's second call (or the first after a flushed trailing job ran): the
    # trailing job, which takes the key's window_key from the leading job.
    if newest.window_key is not None:
        Job.objects.using(db).filter(pk=newest.pk).update(window_key=None)
        newest.window_key = None
    assert newest.max_run_at is not None
    job = _insert(
        plan,
        now,
        db,
        opened_at=newest.opened_at or now,
        ceiling=newest.max_run_at,
        run_at=min(now + plan.window, newest.max_run_at),
    )
    # A locking read that waited saw the rows of its snapshot: a burst another call
    # opened meanwhile shows up only now. Then this call belongs to that one.
    if any(row.pk not in (job.pk, newest.pk) for row in burst_rows(plan.window_key, now, db)):
        raise EdgeRaceError
    return job


def _open(plan: Plan, now: datetime, db: str) -> Job:
    """Open a burst: its leading job, due now; then check no other burst opened meanwhile."""
    assert plan.window_key is not None and plan.max_wait is not None
    # A closed burst's job that no worker claimed yet still runs, but no longer holds the
    # key's window: the new burst's leading job takes it.
    Job.objects.using(db).filter(window_key=plan.window_key).update(window_key=None)
    job = _insert(plan, now, db, opened_at=now, ceiling=now + plan.max_wait, run_at=now)
    others = [row for row in burst_rows(plan.window_key, now, db) if row.pk != job.pk]
    assert plan.window is not None
    if open_burst(others[:1], plan.window, now):
        raise EdgeRaceError
    return job


def _insert(
    plan: Plan, now: datetime, db: str, *, opened_at: datetime, ceiling: datetime, run_at: datetime
) -> Job:
    job = new_job(plan, now)
    job.opened_at, job.max_run_at, job.run_at = opened_at, ceiling, run_at
    if not upsert.insert(job, db):
        job.save(force_insert=True, using=db)
    job.outcome = "created"
    return job
