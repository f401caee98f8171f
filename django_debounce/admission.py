"""The claim-time gate: rate limits, concurrency caps and circuit breakers (contract §6, §11).

:func:`django_debounce.worker.claim_jobs` asks this module which of the due
jobs it selected may start. Flow-control state lives in one
:class:`~django_debounce.models.TaskState` row per gated task name; the claim
transaction locks the rows of the task names among its candidates
(``SELECT … FOR UPDATE SKIP LOCKED``, in ``task_name`` order; a row another
claim holds is skipped, so claimers never deadlock or queue behind a stalled
one, and that task admits nothing in this claim), reads the live state,
admits jobs in claim order and saves the rows before it commits. Every
worker process on every machine therefore shares one token bucket, one
concurrency count and one breaker per task.

Per task, a job is admitted when all of these allow it, checked in this order:

* **circuit breaker** (``circuit_breaker=``): closed — yes; open before
  ``reset`` — no; open after ``reset`` — one job, which becomes the probe
  (the breaker turns half-open); half-open — no, unless the probe's job is no
  longer RUNNING under a live lease (its worker died, or it was shed), in
  which case the job at hand becomes the new probe.
* **concurrency** (``concurrency=N``): RUNNING jobs of the task whose lease
  is live (``lease_expires_at > now``), plus those admitted by this claim,
  stay below N. A dead worker's jobs stop counting when their lease lapses.
* **rate limit** (``rate_limit=``): the bucket holds a whole token, which the
  job takes (:mod:`django_debounce.throttle`).

A job held back stays READY with its ``run_at`` (its place in line). A job of
an ``on_excess="drop"`` task that passes the breaker and concurrency checks
but finds no token is shed instead (``shed:`` dead letter). A breaker never
sheds: while open, jobs wait.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import Count

from . import registry
from .breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from .models import Job, TaskState
from .throttle import EPSILON, TokenBucket, bucket_for

if TYPE_CHECKING:
    from .options import TaskOptions

logger = logging.getLogger("django_debounce.admission")

_STATE_FIELDS = ["tokens", "tokens_at", "breaker_state", "failures", "opened_at", "probe_job_id"]


@dataclass(frozen=True)
class Gate:
    """The flow-control options of one task name, as the claim sees them.

    Attributes:
        task_name: the task's registered name.
        bucket: its token bucket, or ``None`` without ``rate_limit=``.
        drop: ``on_excess="drop"``: a job with no token is shed, not deferred.
        concurrency: the cap on RUNNING jobs, or ``None``.
        breaker: the circuit breaker, or ``None``.
    """

    task_name: str
    bucket: TokenBucket | None
    drop: bool
    concurrency: int | None
    breaker: CircuitBreaker | None


def gate_for(name: str, options: TaskOptions) -> Gate | None:
    """Return the :class:`Gate` of a task's options, or ``None`` when nothing gates it."""
    if options.rate_limit is None and options.concurrency is None and not options.circuit_breaker:
        return None
    return Gate(
        task_name=name,
        bucket=(
            bucket_for(options.rate_limit, options.rate_limit_burst)
            if options.rate_limit is not None
            else None
        ),
        drop=options.on_excess == "drop",
        concurrency=options.concurrency,
        breaker=options.circuit_breaker,
    )


def current_gates() -> dict[str, Gate]:
    """Return the gates of every task registered in this process, by task name.

    Empty when no task has a rate limit, a concurrency cap or a breaker: the
    claim then takes its fast path (no extra queries). Pure Python, no query.
    """
    gates: dict[str, Gate] = {}
    for name, registered in registry.all_tasks().items():
        gate = gate_for(name, registered.options)
        if gate is not None:
            gates[name] = gate
    return gates


def shed_reason(gate: Gate) -> tuple[str, dict[str, Any]]:
    """Return the dead letter's ``(reason, metadata)`` for a job dropped by ``gate``'s rate limit (§6)."""
    assert gate.bucket is not None
    text = gate.bucket.text
    return (
        f"shed: rate limit {text} exceeded",
        {"shed": True, "rate_limit": text, "capacity": gate.bucket.capacity},
    )


@dataclass
class Decision:
    """What one admission round decided, each list in claim order."""

    admitted: list[Job] = field(default_factory=list)
    to_shed: list[tuple[Job, Gate]] = field(default_factory=list)
    held_back: list[Job] = field(default_factory=list)


@dataclass(frozen=True)
class Checkpoint:
    """The in-memory state of an :class:`Admission` at one moment (:meth:`Admission.checkpoint`)."""

    rows: dict[str, tuple[Any, ...]]
    """Each held TaskState row's ``_STATE_FIELDS`` values, by task name."""
    admitted: dict[str, int]
    probe_live: dict[str, bool]
    dirty: frozenset[str]


class Admission:
    """The gate of one claim transaction; create it inside ``transaction.atomic``.

    Args:
        gates: :func:`current_gates` (non-empty).
        now: the claim's instant (aware datetime; ``timezone.now()``).
        using: database alias.

    Rows locked by :meth:`admit` stay locked until the claim commits;
    :meth:`save` writes the changed ones back and must run before the commit.
    A decision can be taken back before :meth:`save` (:meth:`checkpoint`,
    :meth:`restore`), when the claim could not lock some admitted jobs.
    """

    def __init__(self, gates: dict[str, Gate], *, now: datetime, using: str) -> None:
        self.gates = gates
        self.now = now
        self.using = using
        features = connections[using].features
        self._can_lock = features.has_select_for_update
        self._can_skip = features.has_select_for_update_skip_locked
        self.states: dict[str, TaskState] = {}
        self.unavailable: set[str] = set()
        self.running: dict[str, int] = {}
        self.admitted: dict[str, int] = {}
        self.probe_live: dict[str, bool] = {}
        self.dirty: set[str] = set()

    # -- before the candidate query: a cheap, unlocked estimate ------------------------
    def blocked_names(self) -> set[str]:
        """Return gated task names that surely admit nothing now (read without locks).

        The claim leaves their jobs out of its candidate query, so a blocked
        task's backlog neither fills the batch nor keeps row locks, and other
        tasks' jobs are not starved. Blocked: a defer-mode bucket without a
        whole token, a breaker open before its reset, a full concurrency cap.
        A drop-mode bucket without tokens is not blocked: its due jobs must be
        seen to be shed. Costs one query, plus one when a cap is declared.
        """
        names = sorted(self.gates)
        rows = {
            row.task_name: row
            for row in TaskState.objects.using(self.using).filter(task_name__in=names)
        }
        capped = [name for name in names if self.gates[name].concurrency is not None]
        running = self._count_running(capped) if capped else {}
        blocked = set()
        for name in names:
            gate = self.gates[name]
            row = rows.get(name)
            if row is None:
                continue  # never used: full bucket, closed breaker
            if (
                gate.breaker
                and row.breaker_state == OPEN
                and not gate.breaker.probe_due(row, self.now)
            ):
                blocked.add(name)
            elif gate.concurrency is not None and running.get(name, 0) >= gate.concurrency:
                blocked.add(name)
            elif (
                gate.bucket is not None
                and not gate.drop
                and gate.bucket.level(row.tokens, row.tokens_at, self.now) < 1 - EPSILON
            ):
                blocked.add(name)
        return blocked

    def _count_running(self, names: Sequence[str]) -> dict[str, int]:
        """Return RUNNING jobs under a live lease (``lease_expires_at > now``) per task name."""
        return dict(
            Job.objects.using(self.using)
            .filter(task_name__in=list(names), status=Job.Status.RUNNING)
            .filter(lease_expires_at__gt=self.now)
            .values("task_name")
            .annotate(n=Count("id"))
            .values_list("task_name", "n")
        )

    # -- under the lock ------------------------------------------------------------
    def _lock(self, names: Iterable[str]) -> None:
        """Lock (and create where missing) the TaskState rows of ``names`` not yet held.

        Rows locked by another claim are skipped (where the database can skip
        locked rows; otherwise the lock is waited for, in ``task_name``
        order): those names admit nothing in this claim, and their jobs stay
        READY for the next one. Never waiting matters: a claimer stalled
        inside its claim transaction (SIGSTOP, a paused VM, a debugger) would
        otherwise hold every other worker of the deployment in its claim,
        ungated jobs included, for as long as it stays stalled.
        """
        wanted = sorted(set(names) - set(self.states) - self.unavailable)
        if not wanted:
            return
        qs = TaskState.objects.using(self.using).filter(task_name__in=wanted).order_by("task_name")
        if self._can_lock:
            qs = qs.select_for_update(skip_locked=self._can_skip)
        found = {row.task_name: row for row in qs}
        missing = [name for name in wanted if name not in found]
        if missing:
            existing = set(
                TaskState.objects.using(self.using)
                .filter(task_name__in=missing)
                .values_list("task_name", flat=True)
            )
            TaskState.objects.using(self.using).bulk_create(
                [TaskState(task_name=name) for name in missing if name not in existing],
                ignore_conflicts=True,
            )
            qs = TaskState.objects.using(self.using).filter(task_name__in=missing)
            if self._can_lock:
                qs = qs.select_for_update(skip_locked=self._can_skip)
            found.update({row.task_name: row for row in qs.order_by("task_name")})
        self.states.update(found)
        self.unavailable.update(name for name in wanted if name not in found)
        capped = [name for name in found if self.gates[name].concurrency is not None]
        if capped:
            counts = self._count_running(capped)
            for name in capped:
                self.running[name] = counts.get(name, 0)
        for name, row in found.items():
            if self.gates[name].breaker and row.breaker_state == HALF_OPEN:
                self.probe_live[name] = (
                    row.probe_job_id is not None
                    and Job.objects.using(self.using)
                    .filter(
                        pk=row.probe_job_id,
                        status=Job.Status.RUNNING,
                        lease_expires_at__gt=self.now,
                    )
                    .exists()
                )

    def hold(self, candidates: Sequence[Job]) -> None:
        """Lock the TaskState rows of the gated tasks among ``candidates`` (see :meth:`admit`)."""
        self._lock({job.task_name for job in candidates if job.task_name in self.gates})

    def checkpoint(self) -> Checkpoint:
        """Return the in-memory state of the rows held so far, for :meth:`restore`.

        Take it after :meth:`hold` of the candidates, before :meth:`admit`.
        """
        return Checkpoint(
            rows={
                name: tuple(getattr(row, attr) for attr in _STATE_FIELDS)
                for name, row in self.states.items()
            },
            admitted=dict(self.admitted),
            probe_live=dict(self.probe_live),
            dirty=frozenset(self.dirty),
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Take back every decision made since ``checkpoint``: tokens, counts, probes.

        The rows stay locked (they are released at the claim's commit); rows
        locked after the checkpoint keep their state as read.
        """
        for name, values in checkpoint.rows.items():
            row = self.states[name]
            for attr, value in zip(_STATE_FIELDS, values, strict=True):
                setattr(row, attr, value)
        self.admitted = dict(checkpoint.admitted)
        self.probe_live = dict(checkpoint.probe_live)
        self.dirty = set(checkpoint.dirty)

    def admit(self, candidates: Sequence[Job], room: int) -> Decision:
        """Decide, in claim order, which ``candidates`` start (at most ``room``).

        Candidates past ``room`` are held back unexamined. Tokens taken and
        breaker transitions are applied to the locked rows in memory; call
        :meth:`save` before the transaction commits.
        """
        decision = Decision()
        self.hold(candidates)
        for job in candidates:
            if len(decision.admitted) >= room:
                decision.held_back.append(job)
                continue
            gate = self.gates.get(job.task_name)
            if gate is None:
                decision.admitted.append(job)
                continue
            verdict = self._check(gate, job)
            if verdict == "admit":
                decision.admitted.append(job)
            elif verdict == "shed":
                decision.to_shed.append((job, gate))
            else:
                decision.held_back.append(job)
        return decision

    def _check(self, gate: Gate, job: Job) -> str:
        name = gate.task_name
        state = self.states.get(name)
        if state is None:
            return "hold"  # locked by another claimer right now
        probe = False
        if gate.breaker is not None:
            if state.breaker_state == OPEN:
                if not gate.breaker.probe_due(state, self.now):
                    return "hold"
                probe = True
            elif state.breaker_state == HALF_OPEN:
                if self.probe_live.get(name, False):
                    return "hold"
                probe = True
        if gate.concurrency is not None:
            if self.running.get(name, 0) + self.admitted.get(name, 0) >= gate.concurrency:
                return "hold"
        if gate.bucket is not None:
            level = gate.bucket.level(state.tokens, state.tokens_at, self.now)
            if level < 1 - EPSILON:
                return "shed" if gate.drop else "hold"
            state.tokens = max(0.0, level - 1)
            # Never move tokens_at back: a claim whose ``now`` was read before it waited for
            # this row's lock must not refill again the time another claim already counted.
            if state.tokens_at is None or state.tokens_at < self.now:
                state.tokens_at = self.now
            self.dirty.add(name)
        if probe:
            state.breaker_state = HALF_OPEN
            state.probe_job_id = job.pk
            self.probe_live[name] = True
            self.dirty.add(name)
            logger.info(
                "circuit breaker of %s half-open: job %s runs as the probe",
                name,
                job.pk,
                extra={"action": "breaker_probe", "job_id": job.pk},
            )
        self.admitted[name] = self.admitted.get(name, 0) + 1
        return "admit"

    def exhausted_names(self) -> set[str]:
        """Return gated names that can admit nothing more in this claim.

        The next candidate round leaves them out. A drop-mode task without
        tokens is not exhausted: its further due jobs are to be shed.
        """
        out = set(self.unavailable)
        for name, state in self.states.items():
            gate = self.gates[name]
            if gate.breaker is not None:
                if state.breaker_state == OPEN and not gate.breaker.probe_due(state, self.now):
                    out.add(name)
                    continue
                if state.breaker_state == HALF_OPEN and self.probe_live.get(name, False):
                    out.add(name)
                    continue
            if gate.concurrency is not None and (
                self.running.get(name, 0) + self.admitted.get(name, 0) >= gate.concurrency
            ):
                out.add(name)
                continue
            if (
                gate.bucket is not None
                and not gate.drop
                and gate.bucket.level(state.tokens, state.tokens_at, self.now) < 1 - EPSILON
            ):
                out.add(name)
        return out

    def save(self) -> None:
        """Write the TaskState rows this claim changed (one UPDATE each)."""
        for name in sorted(self.dirty):
            self.states[name].save(using=self.using, update_fields=_STATE_FIELDS)
        self.dirty.clear()


def record_run(job: Job, *, succeeded: bool, now: datetime, using: str) -> None:
    """Count a finished run of ``job`` in its task's circuit breaker (§6).

    Every run that raised is a failure, one that will be retried included; a
    success resets the count. Call it in the transaction that writes the
    run's outcome: the task's TaskState row is locked (created if missing)
    and saved there. Does nothing for a task without a breaker or one this
    process does not know (an ``unknown_task:`` dead letter never counts).

    Args:
        job: the job whose run finished (its ``pk`` identifies the probe).
        succeeded: True for a run that returned, False for one that raised.
        now: the outcome's instant (aware datetime).
        using: database alias.
    """
    task = registry.lookup(job.task_name)
    breaker = task.options.circuit_breaker if task is not None else None
    if breaker is None:
        return
    with transaction.atomic(using=using):
        qs = TaskState.objects.using(using).filter(task_name=job.task_name)
        if connections[using].features.has_select_for_update:
            qs = qs.select_for_update()
        state = qs.first()
        if state is None:
            TaskState.objects.using(using).bulk_create(
                [TaskState(task_name=job.task_name)], ignore_conflicts=True
            )
            state = qs.get()
        before = state.breaker_state
        if succeeded:
            changed = breaker.record_success(state, job.pk)
        else:
            changed = breaker.record_failure(state, job.pk, now)
        if changed:
            state.save(using=using, update_fields=_STATE_FIELDS)
    if state.breaker_state != before:
        log = logger.warning if state.breaker_state == OPEN else logger.info
        log(
            "circuit breaker of %s: %s -> %s after job %s %s (%d consecutive failure(s))",
            job.task_name,
            before,
            state.breaker_state,
            job.pk,
            "succeeded" if succeeded else "failed",
            state.failures,
            extra={"action": "breaker", "job_id": job.pk},
        )


__all__ = [
    "CLOSED",
    "Admission",
    "Checkpoint",
    "Decision",
    "Gate",
    "current_gates",
    "gate_for",
    "record_run",
    "shed_reason",
]
