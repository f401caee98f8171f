"""CoDel per queue (contract §6, §11), after RFC 8289 (Nichols, Jacobson et al., 2018).

A job's **sojourn time** is how long it waited to be claimed: claim time −
``run_at`` (the moment it became due, so a debounce window's quiet time does
not count). Each claim feeds the sojourn of every candidate job, in claim
order, through the control law of RFC 8289 §5; a job the law drops is shed
(status SHED, a dead letter with reason prefix ``codel:`` and metadata
``{"codel": True, ...}``, dependents cancelled, no signal) if its task has
``on_excess="drop"``, and runs otherwise.

The mapping onto RFC 8289 §5 (names in parentheses are the RFC's):

* a claim of a job is a dequeue; ``now`` is the claim transaction's
  ``timezone.now()`` (§4.7), shared by every job of one claim;
* :class:`CodelState` is the RFC's per-queue state (``first_above_time``,
  ``dropping``, ``drop_next``, ``count``, ``lastcount``), stored in one
  :class:`~django_debounce.models.QueueState` row per queue and updated under
  that row's lock inside the claim transaction, so every worker of the queue,
  on every machine, drives one shared law;
* "queue nearly empty" (the RFC's ``bytes() <= MAXPACKET``, which stops a
  queue holding one packet from counting as above target): the job at hand is
  the last due READY job of its queue (no other due job waits behind it).
  Then ``first_above_time`` is reset, as for a sojourn below target, and a
  drained queue leaves the dropping state;
* only jobs of tasks with ``on_excess="drop"`` may be shed. When the law
  says "drop" at a job that may not be shed (a ``defer`` task, or a task this
  process does not know), that job runs and the drop stays pending: the state
  does not advance, so the next droppable job the law still finds above target
  is shed instead;
* the RFC's ``while`` loop (drop, dequeue the next packet, drop again if
  ``now >= drop_next``) becomes one step per job: a drop in the dropping state
  counts it and schedules the next drop at ``control_law(drop_next, count)``
  at once, and the next job's step re-checks ``ok_to_drop`` and
  ``now >= drop_next``. (The RFC schedules only if the next packet is still
  above target; the two differ only in the ``drop_next`` left behind when the
  dropping state ends, by at most one ``interval / sqrt(count)``. Likewise the
  job after an entry drop gets its own step, which ends the new dropping state
  at once if that job's wait is below target.) When a claim's candidates are
  all shed, the claim commits and claims again, so ``--burst`` never stops
  while jobs are due;
* a dropping state whose ``drop_next`` lies more than one ``interval`` in the
  past (no claim for a while: every worker was stopped) resumes from
  ``now − interval`` instead of catching up, so a restarted worker does not
  shed thousands of jobs in one claim to pay off the time nobody claimed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections

from .. import lifecycle, registry
from ..conf import CodelSettings, settings
from ..models import Job, QueueState

logger = logging.getLogger("django_debounce.codel")

#: RFC 8289 §5 (the Linux variant it adopts): re-use the last drop rate if the previous
#: dropping state ended less than this many intervals ago.
REENTRY_INTERVALS = 16


@dataclass
class CodelState:
    """The RFC 8289 §5 state of one queue (mutable; :func:`step` updates it).

    Attributes:
        first_above_at: when the sojourn time will have stayed above target for
            a full interval (RFC ``first_above_time``); ``None`` while below
            target (the RFC's ``0``).
        dropping: the queue is in the dropping state (RFC ``dropping``).
        drop_next_at: when the next drop is due while dropping (RFC ``drop_next``).
        drop_count: drops in the current dropping state (RFC ``count``).
        last_drop_count: ``drop_count`` when the current or last dropping state
            began (RFC ``lastcount``).
    """

    first_above_at: datetime | None = None
    dropping: bool = False
    drop_next_at: datetime | None = None
    drop_count: int = 0
    last_drop_count: int = 0

    @classmethod
    def from_row(cls, row: QueueState) -> CodelState:
        """Return the state held by a :class:`~django_debounce.models.QueueState` row."""
        return cls(
            first_above_at=row.first_above_at,
            dropping=row.dropping,
            drop_next_at=row.drop_next_at,
            drop_count=row.drop_count,
            last_drop_count=row.last_drop_count,
        )

    def to_row(self, row: QueueState) -> None:
        """Copy this state onto ``row`` (not saved)."""
        row.first_above_at = self.first_above_at
        row.dropping = self.dropping
        row.drop_next_at = self.drop_next_at
        row.drop_count = self.drop_count
        row.last_drop_count = self.last_drop_count


def control_law(t: datetime, count: int, interval: timedelta) -> datetime:
    """Return ``t + interval / sqrt(count)``, the time of the next drop (RFC 8289 §5).

    Args:
        t: the time the spacing counts from (the last scheduled drop, or now
            when a dropping state begins).
        count: drops so far in this dropping state, ≥ 1.
        interval: the queue's CoDel interval.

    Raises:
        ValueError: ``count`` is below 1.
    """
    if count < 1:
        raise ValueError(f"count={count} must be at least 1")
    return t + interval / math.sqrt(count)


def ok_to_drop(
    state: CodelState,
    *,
    sojourn: timedelta,
    now: datetime,
    params: CodelSettings,
    nearly_empty: bool = False,
) -> bool:
    """Track how long the sojourn has stayed above target; RFC 8289 §5 ``dodequeue``.

    Returns True once the sojourn time has been at or above ``params.target``
    for a full ``params.interval`` (``now >= first_above_at``). A sojourn below
    target, or a queue nearly empty (the job at hand is the last one due),
    resets ``first_above_at``; the first sojourn above target sets it to
    ``now + interval``. Updates ``state.first_above_at`` in place.

    Args:
        state: the queue's state.
        sojourn: the job's wait, claim time − ``run_at`` (may be negative
            under a clock moved backwards; counts as below target).
        now: the claim time.
        params: the queue's target and interval.
        nearly_empty: no other due job waits behind this one in its queue.
    """
    if sojourn < params.target or nearly_empty:
        state.first_above_at = None
        return False
    if state.first_above_at is None:
        state.first_above_at = now + params.interval
        return False
    return now >= state.first_above_at


def step(
    state: CodelState,
    *,
    sojourn: timedelta,
    now: datetime,
    params: CodelSettings,
    droppable: bool = True,
    nearly_empty: bool = False,
) -> bool:
    """Feed one claimed job through the control law; return True to drop (shed) it.

    RFC 8289 §5 ``dequeue`` for one job (see the module docstring for how
    the RFC's drop loop maps onto one call per job). Updates ``state`` in place:

    * dropping and the sojourn is no longer above target for an interval:
      leave the dropping state, run the job;
    * dropping and ``now >= drop_next_at``: drop, ``drop_count += 1``, next
      drop at ``control_law(drop_next_at, drop_count)``;
    * not dropping and above target for a full interval: drop and enter the
      dropping state with ``drop_count = 1``, or, when the last dropping state
      ended less than 16 intervals ago and dropped more than one job, with
      ``drop_count = drop_count − last_drop_count`` from then (RFC 8289 §5);
      next drop at ``control_law(now, drop_count)``.

    Args:
        state: the queue's state.
        sojourn: claim time − the job's ``run_at``.
        now: the claim time.
        params: the queue's target and interval.
        droppable: the job's task has ``on_excess="drop"``. When False the job
            runs and a drop the law would make now stays pending (the state
            does not advance), so it falls on the next droppable job.
        nearly_empty: the job is the last due job of its queue (RFC's
            ``bytes() <= MAXPACKET``).
    """
    ok = ok_to_drop(state, sojourn=sojourn, now=now, params=params, nearly_empty=nearly_empty)
    if state.dropping:
        if not ok:
            state.dropping = False
            return False
        if not droppable:
            return False
        if state.drop_next_at is None:  # a row edited by hand: schedule from now
            state.drop_next_at = now
        if state.drop_next_at < now - params.interval:
            # Nobody claimed for a while: resume the schedule instead of catching up.
            state.drop_next_at = now - params.interval
        if now < state.drop_next_at:
            return False
        state.drop_count += 1
        state.drop_next_at = control_law(state.drop_next_at, state.drop_count, params.interval)
        return True
    if not ok or not droppable:
        return False
    delta = state.drop_count - state.last_drop_count
    count = 1
    if (
        delta > 1
        and state.drop_next_at is not None
        and now - state.drop_next_at < REENTRY_INTERVALS * params.interval
    ):
        count = delta
    state.dropping = True
    state.drop_count = count
    state.last_drop_count = count
    state.drop_next_at = control_law(now, count, params.interval)
    return True


def _droppable(job: Job) -> bool:
    task = registry.lookup(job.task_name)
    return task is not None and task.options.on_excess == "drop"


def _lock_states(queues: list[str], using: str) -> dict[str, QueueState]:
    """Return the QueueState rows of ``queues``, locked, creating missing ones.

    A row another claim holds is skipped where the database can skip locked
    rows (its queue is then missing from the result): a claimer stalled inside
    its claim (SIGSTOP, a paused VM) must not hold every other worker's claim.
    """
    skip = connections[using].features.has_select_for_update_skip_locked
    rows = {
        row.queue: row
        for row in QueueState.objects.using(using)
        .select_for_update(skip_locked=skip)
        .filter(queue__in=queues)
        .order_by("queue")
    }
    missing = [queue for queue in queues if queue not in rows]
    if missing:
        # Insert only rows that do not exist: a skipped (locked) row is not missing, and
        # MariaDB's INSERT IGNORE waits for the lock on the row it would duplicate.
        existing = set(
            QueueState.objects.using(using)
            .filter(queue__in=missing)
            .values_list("queue", flat=True)
        )
        QueueState.objects.using(using).bulk_create(
            [QueueState(queue=queue) for queue in missing if queue not in existing],
            ignore_conflicts=True,
        )
        rows.update(
            (row.queue, row)
            for row in QueueState.objects.using(using)
            .select_for_update(skip_locked=skip)
            .filter(queue__in=missing)
            .order_by("queue")
        )
    return rows


def apply_codel(
    jobs: Sequence[Job],
    *,
    now: datetime,
    using: str = DEFAULT_DB_ALIAS,
    busy: set[str] | None = None,
) -> list[Job]:
    """Run the claim's candidate jobs through their queues' CoDel law; shed the dropped ones.

    Call it inside the claim transaction, after the candidates are locked and
    before they are marked RUNNING, as the claim's last lock: a transaction
    that waited for another lock (a TaskState row, say) while holding a
    QueueState row could deadlock with a claimer that locks in the usual order
    (TaskState rows, then QueueState rows). Queues without CoDel in
    ``DEBOUNCE_QUEUES`` are passed through untouched, and when no candidate
    is in a CoDel queue no query runs. Otherwise it locks the queues'
    :class:`~django_debounce.models.QueueState` rows (``SELECT … FOR UPDATE``,
    ordered by queue; missing rows are created first), feeds each candidate in
    claim order through :func:`step`, sheds the dropped ones with
    :func:`~django_debounce.lifecycle.shed` (reason ``codel: …``, metadata
    ``{"codel": True, "sojourn_seconds", "target_seconds",
    "interval_seconds"}``), and saves the states.

    Args:
        jobs: the claim's candidates, READY and locked, in claim order.
        now: the claim time (``timezone.now()`` of the claim, §4.7).
        using: database alias.
        busy: if given, the queues whose row another claim holds are added to it
            (the caller may claim again without them).

    Returns:
        The candidates that still run, in their order. Candidates of a queue
        whose row another claim holds right now are left out (neither run nor
        shed: they stay READY for the next claim).

    Raises:
        ConfigurationError: ``DEBOUNCE_QUEUES`` is invalid (the system check
            ``django_debounce.E012`` reports it at startup).
    """
    config = settings.codel
    if not config:
        return list(jobs)
    queues = sorted({job.queue for job in jobs if job.queue in config})
    if not queues:
        return list(jobs)
    rows = _lock_states(queues, using)
    locked_elsewhere = {queue for queue in queues if queue not in rows}
    if busy is not None:
        busy |= locked_elsewhere
    queues = [queue for queue in queues if queue in rows]
    states = {queue: CodelState.from_row(rows[queue]) for queue in queues}
    last_of_queue = {job.queue: index for index, job in enumerate(jobs)}
    claimed_ids = [job.pk for job in jobs]
    kept: list[Job] = []
    shed = 0
    for index, job in enumerate(jobs):
        if job.queue in locked_elsewhere:
            continue  # another claim holds the queue's law: the job waits for the next claim
        params = config.get(job.queue)
        if params is None:
            kept.append(job)
            continue
        sojourn = now - job.run_at
        nearly_empty = False
        if index == last_of_queue[job.queue] and sojourn >= params.target:
            # The RFC's "queue nearly empty": no other due job waits behind this one.
            nearly_empty = (
                not Job.objects.using(using)
                .filter(queue=job.queue, status=Job.Status.READY, run_at__lte=now)
                .exclude(pk__in=claimed_ids)
                .exists()
            )
        drop = step(
            states[job.queue],
            sojourn=sojourn,
            now=now,
            params=params,
            droppable=_droppable(job),
            nearly_empty=nearly_empty,
        )
        if not drop:
            kept.append(job)
            continue
        wait = sojourn.total_seconds()
        target = params.target.total_seconds()
        letter = lifecycle.shed(
            job,
            reason=(
                f"codel: waited {wait:.1f}s, over target {target:g}s for a full interval "
                f"({params.interval.total_seconds():g}s)"
            ),
            metadata={
                "codel": True,
                "sojourn_seconds": wait,
                "target_seconds": target,
                "interval_seconds": params.interval.total_seconds(),
                "drop_count": states[job.queue].drop_count,
            },
            now=now,
            using=using,
        )
        if letter is None:  # no longer READY: leave it out of the claim
            continue
        shed += 1
    for queue in queues:
        states[queue].to_row(rows[queue])
        rows[queue].save(
            using=using,
            update_fields=[
                "first_above_at",
                "dropping",
                "drop_next_at",
                "drop_count",
                "last_drop_count",
            ],
        )
    if shed:
        logger.info(
            "CoDel shed %d job(s) in queue(s) %s",
            shed,
            queues,
            extra={"action": "codel_shed"},
        )
    return kept
