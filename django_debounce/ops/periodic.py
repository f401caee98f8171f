"""Deferring the ticks of periodic tasks: one job per tick, whoever schedules (decisions 177-179).

A :class:`PeriodicScheduler` runs in each built-in worker's loop and in the
Celery dispatcher's. On each poll, :meth:`PeriodicScheduler.defer_due` looks at
every schedule this process registered (``@task(schedule=...)``,
``@periodic_task``, ``DEBOUNCE_SCHEDULES``: decision 209) and, for one whose next tick has come, defers the
**latest** tick no older than its lateness cap
(``DEBOUNCE_PERIODIC_MAX_LATENESS``; ``Schedule.max_lateness``): after a
downtime the ticks missed before it are never run, and one older than the cap
is not run either (no catch-up storm, decision 178).

Deferring a tick is one transaction (:func:`defer_tick`): insert the
``PeriodicTick`` row (unique on schedule and tick), then enqueue the job
through the ordinary enqueue path (the task's options, flow control and
debouncing apply), then record the job on the row. A scheduler that loses the
race for the row gets an ``IntegrityError`` on the unique constraint: it
writes nothing and moves on, so however many schedulers run, a tick has one
job (PostgreSQL, MariaDB, SQLite). Unless the schedule says ``overlap=True``,
the winner first looks at the job of the schedule's previous tick: while it is
READY or RUNNING, the tick is recorded as skipped (``outcome="overlap"``) and
no job is written (decision 179). Only the latest tick runs, never one before
it: the transaction first locks the schedule's latest row (so deferrers of one
schedule take turns), and a tick earlier than a row already there is refused
as :data:`STALE`, nothing written (a scheduler whose clock is behind, decision 191).

The winner also deletes the schedule's rows older than :data:`TICK_RETENTION`
(a week), so the table stays about a week of ticks per schedule.

Between ticks a scheduler costs no query: the next tick of each schedule is
kept in memory, and :meth:`PeriodicScheduler.next_tick` tells an idle loop
when to wake.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.utils import timezone

from .. import databases, registry
from ..enqueueing.call import enqueue_call
from ..exceptions import ConfigurationError
from ..models import Job, PeriodicTick
from ..registry import RegisteredTask
from ..schedules import Schedule
from ..settings_schedules import settings_schedules

logger = logging.getLogger("django_debounce.periodic")

#: How long a schedule's ticks are kept: the winner of a tick deletes the schedule's older
#: rows in its transaction (one indexed DELETE), so the table holds about a week per schedule.
TICK_RETENTION = timedelta(days=7)
#: Seconds a loop sleeps past a tick, so that it wakes with the clock past the tick.
TICK_SLACK = 0.01
#: The outcomes :func:`defer_tick` reports besides an enqueue's (``created``, ...).
TAKEN = "taken"
"""Another scheduler holds the tick's row: nothing was written."""
STALE = "stale"
"""A later tick of the schedule was already deferred (this clock is behind): nothing was written."""


@dataclass(frozen=True)
class Periodic:
    """A schedule with the task it runs."""

    task: RegisteredTask
    schedule: Schedule

    @property
    def name(self) -> str:
        """The schedule's name (``PeriodicTick.schedule``)."""
        return self.schedule.name or self.task.name


def registered_schedules() -> list[Periodic]:
    """Return every schedule of the tasks registered in this process, by name.

    The schedules declared in code, then those of ``DEBOUNCE_SCHEDULES`` whose
    entry resolves (:func:`~django_debounce.settings_schedules.settings_schedules`;
    a refused entry, or a setting of the wrong shape, is logged once and left
    out: ``manage.py check`` reports it, as E048 or E047).
    """
    found = [
        Periodic(task, schedule)
        for task in registry.all_tasks().values()
        for schedule in task.options.schedule
        if isinstance(schedule, Schedule)
    ]
    try:
        found += [Periodic(task, schedule) for task, schedule in settings_schedules().schedules]
    except ConfigurationError as exc:  # the setting's shape (E047): its schedules do not run
        if str(exc) not in _refused:
            _refused.add(str(exc))
            logger.error("%s", exc, extra={"action": "periodic_settings_error"})
    return sorted(found, key=lambda p: p.name)


#: The messages of setting shapes already logged (once per process each).
_refused: set[str] = set()


def _db(periodic: Periodic) -> str:
    """Return the database of a tick's row: its job's, so both are one transaction (decision 224)."""
    return databases.for_job(periodic.task.options.queue, periodic.task.name)


def defer_tick(periodic: Periodic, tick: datetime, *, scheduler_id: str = "") -> str:
    """Defer one tick: its ``PeriodicTick`` row and its job, in one transaction.

    Args:
        periodic: the schedule and its task.
        tick: the tick's instant (aware).
        scheduler_id: recorded on the row (``deferred_by``).

    Returns:
        The enqueue's outcome (``"created"``, ``"debounced"``, ``"coalesced"``),
        ``"overlap"`` (skipped: the previous tick's job is READY or RUNNING),
        :data:`TAKEN` (another scheduler deferred the tick: nothing written),
        or :data:`STALE` (a later tick was deferred already, by a scheduler whose
        clock is ahead: nothing written, decision 191).

    Raises:
        DatabaseError: the database failed (nothing was written); the enqueue's
            own errors (say, a rate limit's ``on_excess="drop"`` does not raise,
            but an ``EnqueueContentionError`` does).
    """
    db = _db(periodic)
    name, schedule = periodic.name, periodic.schedule
    ticks = PeriodicTick.objects.using(db)
    seen = _newest_from(name, tick, db)
    if seen is not None:  # the common case of many schedulers: no failed insert in the log
        return _not_mine(name, tick, seen, scheduler_id)
    with transaction.atomic(using=db):
        # One deferrer of the schedule at a time: lock its latest row (decision 191), so a
        # racer deferring another tick waits here, and the query below, a statement after the
        # wait, sees its row (READ COMMITTED; SQLite's IMMEDIATE transaction holds the lock).
        list(
            ticks.select_for_update()
            .filter(schedule=name)
            .order_by("-tick")
            .values_list("pk", flat=True)[:1]
        )
        seen = _newest_from(name, tick, db)
        if seen is not None:
            return _not_mine(name, tick, seen, scheduler_id)
        try:
            with transaction.atomic(using=db):
                row = ticks.create(
                    schedule=name,
                    tick=tick,
                    task_name=periodic.task.name,
                    deferred_at=timezone.now(),
                    deferred_by=scheduler_id[:255],
                )
        except IntegrityError:
            return TAKEN
        if not schedule.overlap and _previous_in_flight(name, tick, db):
            row.outcome = PeriodicTick.Outcome.OVERLAP
            row.save(update_fields=["outcome"], using=db)
            return row.outcome
        kwargs = dict(schedule.kwargs)
        if schedule.pass_tick:
            kwargs["tick"] = tick.astimezone(schedule.zone)
        job = enqueue_call(periodic.task, periodic.task.name, list(schedule.args), kwargs, {})
        row.job_id, row.outcome = job.pk, job.outcome
        row.save(update_fields=["job_id", "outcome"], using=db)
        # The overlap check above was the last reader of the older rows.
        ticks.filter(schedule=name, tick__lt=min(tick, row.deferred_at - TICK_RETENTION)).delete()
    logger.info(
        "periodic %s: tick %s deferred as job %s (%s)",
        name,
        tick.isoformat(),
        job.pk,
        job.outcome,
        extra={"action": "periodic_tick", "schedule": name, "job_id": job.pk},
    )
    return job.outcome


def _newest_from(name: str, tick: datetime, db: str) -> datetime | None:
    """The schedule's latest tick at or after ``tick`` (``None``: none deferred yet)."""
    return (
        PeriodicTick.objects.using(db)
        .filter(schedule=name, tick__gte=tick)
        .order_by("-tick")
        .values_list("tick", flat=True)
        .first()
    )


def _not_mine(name: str, tick: datetime, seen: datetime, scheduler_id: str) -> str:
    """:data:`TAKEN` for ``tick`` already deferred; :data:`STALE` (logged) for an earlier tick."""
    if seen == tick:
        return TAKEN
    logger.warning(
        "periodic %s: tick %s not deferred, tick %s was already (is the clock of scheduler "
        "%r behind?)",
        name,
        tick.isoformat(),
        seen.isoformat(),
        scheduler_id,
        extra={"action": "periodic_stale", "schedule": name},
    )
    return STALE


def _previous_in_flight(name: str, tick: datetime, db: str) -> bool:
    """True while the job of the schedule's latest earlier tick with a job is READY or RUNNING."""
    previous = (
        PeriodicTick.objects.using(db)
        .filter(schedule=name, tick__lt=tick, job_id__isnull=False)
        .order_by("-tick")
        .values_list("job_id", flat=True)
        .first()
    )
    if previous is None:
        return False
    live = [Job.Status.READY, Job.Status.RUNNING]
    return Job.objects.using(db).filter(pk=previous, status__in=live).exists()


class PeriodicScheduler:
    """Defer due ticks of this process's schedules; remember each schedule's next tick.

    Args:
        scheduler_id: recorded on the ticks this scheduler wins.
        enabled: ``False`` (``run_debounce_worker --no-periodic``): defer
            nothing, wake for nothing.

    One per loop (a worker, a dispatcher); not thread-safe.
    """

    def __init__(self, *, scheduler_id: str = "", enabled: bool = True) -> None:
        self.scheduler_id = scheduler_id
        self.enabled = enabled
        #: schedule name -> the first tick not handled yet (``None``: none within 50 years).
        self._next: dict[str, datetime | None] = {}

    def defer_due(self, now: datetime | None = None) -> dict[str, str]:
        """Defer the latest due tick of every schedule whose next tick has come.

        Args:
            now: the instant (default: ``timezone.now()``).

        Returns:
            ``{schedule name: outcome}`` for each tick this call looked at
            (see :func:`defer_tick`; ``"late"``: the latest tick was older than
            the lateness cap and was not deferred).

        Raises:
            DatabaseError: the database failed; the tick is tried again on the next call.
        """
        if not self.enabled:
            return {}
        now = now or timezone.now()
        done: dict[str, str] = {}
        current = registered_schedules()
        for gone in set(self._next) - {p.name for p in current}:
            del self._next[gone]  # unregistered (tests): never a tick to wake for
        for periodic in current:
            name, schedule = periodic.name, periodic.schedule
            cap = schedule.lateness()
            if name not in self._next:
                # First look (a start): the latest tick within the cap may still be due.
                self._next[name] = schedule.next_after(now - cap)
            upcoming = self._next[name]
            if upcoming is None or upcoming > now:
                continue
            tick = schedule.latest_until(upcoming - timedelta(microseconds=1), now) or upcoming
            if now - tick >= cap:
                done[name] = "late"
                logger.warning(
                    "periodic %s: tick %s is %s late, past its cap of %s: not run",
                    name,
                    tick.isoformat(),
                    now - tick,
                    cap,
                    extra={"action": "periodic_late", "schedule": name},
                )
            else:
                try:
                    done[name] = defer_tick(periodic, tick, scheduler_id=self.scheduler_id)
                except Exception as exc:
                    if _is_database_error(exc):
                        raise  # tried again on the next call
                    done[name] = "error"
                    logger.exception(
                        "periodic %s: tick %s could not be deferred",
                        name,
                        tick.isoformat(),
                        extra={"action": "periodic_error", "schedule": name},
                    )
            self._next[name] = schedule.next_after(tick)
        return done

    def next_tick(self) -> datetime | None:
        """Return the earliest tick not deferred yet of the schedules looked at (``None``: none)."""
        if not self.enabled:
            return None
        return min((t for t in self._next.values() if t is not None), default=None)

    def cap_wait(self, timeout: float) -> float:
        """Return ``timeout`` (seconds), shortened so a sleeping loop wakes at the next tick.

        Wakes :data:`TICK_SLACK` after the tick, so the clock has passed it.
        """
        upcoming = self.next_tick()
        if upcoming is None:
            return timeout
        until = (upcoming - timezone.now()).total_seconds() + TICK_SLACK
        return max(0.0, min(timeout, until))


def _is_database_error(exc: Exception) -> bool:
    from django.db import DatabaseError, InterfaceError

    return isinstance(exc, DatabaseError | InterfaceError)


def schedule_rows(
    *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> list[dict[str, Any]]:
    """Return each registered schedule with its next tick and its last deferred tick (JSON-ready).

    One query per schedule (its latest ``PeriodicTick``, by the unique index).
    Keys: ``name``, ``task``, ``cron``, ``tz``, ``next_tick``, ``last_tick``,
    ``last_outcome``, ``last_job_id``.
    """
    now = now or timezone.now()
    rows = []
    for periodic in registered_schedules():
        schedule = periodic.schedule
        last = (
            PeriodicTick.objects.using(using)
            .filter(schedule=periodic.name)
            .order_by("-tick")
            .values("tick", "outcome", "job_id")
            .first()
        )
        upcoming = schedule.next_after(now)
        rows.append(
            {
                "name": periodic.name,
                "task": periodic.task.name,
                "cron": schedule.cron,
                "tz": getattr(schedule.zone, "key", None) or str(schedule.zone),
                # UTC, as every other instant of the status (the zone is in "tz").
                "next_tick": upcoming.astimezone(UTC).isoformat() if upcoming else None,
                "last_tick": last["tick"].isoformat() if last else None,
                "last_outcome": last["outcome"] if last else None,
                "last_job_id": last["job_id"] if last else None,
            }
        )
    return rows


__all__ = [
    "STALE",
    "TAKEN",
    "TICK_RETENTION",
    "TICK_SLACK",
    "Periodic",
    "PeriodicScheduler",
    "defer_tick",
    "registered_schedules",
    "schedule_rows",
]
