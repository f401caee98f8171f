"""The claim-time gate: rate limits, concurrency caps and circuit breakers (contract §6, §11).

:func:`django_debounce.claim.claiming.claim_jobs` asks this module which of the due
jobs it selected may start. Flow-control state lives in one
:class:`~django_debounce.models.TaskState` row per gated task name; the claim
transaction locks the rows of the task names among its candidates
(``SELECT … FOR UPDATE SKIP LOCKED``, in ``task_name`` order; a row another
claim holds is skipped, so claimers never deadlock or queue behind a stalled
one, and that task admits nothing in this claim), reads the live state,
admits jobs in claim order and saves the rows before it commits. Every
worker process on every machine therefore shares one token bucket, one
concurrency count and one breaker per task.

Per task, a job is admitted when its circuit breaker, concurrency cap and
rate limit all allow it: the rules and their order are
:func:`django_debounce.flow.rules.verdict`, the one place they are written
(the admin's "held back by" explanation reads the same verdict). This module
gathers what the verdict needs under the row locks (the live state, the
running count, whether a half-open breaker's probe still runs) and applies
an admit: the job takes a token, or becomes the breaker's probe.

A job held back stays READY with its ``run_at`` (its place in line). A drop-mode job that
passes the breaker and cap but finds no token is shed instead (``shed:`` dead letter); a
breaker never sheds. Rate limits per key: :mod:`django_debounce.flow.key_rates`.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Count

from ..breaker import CLOSED, HALF_OPEN
from ..models import Job, TaskState
from . import redis_tokens
from .key_rates import KeyRows
from .redis_buckets import Level
from .rules import Gate, live_lease, verdict
from .start_rules import JudgedAtStart

logger = logging.getLogger("django_debounce.admission")
_STATE_FIELDS = TaskState.STATE_FIELDS


@dataclass
class Decision:
    """What one admission round decided, each list in claim order."""

    admitted: list[Job] = field(default_factory=list)
    to_shed: list[tuple[Job, Gate]] = field(default_factory=list)
    held_back: list[Job] = field(default_factory=list)
    cut: bool = False
    """True when the round stopped at a job judged at its start with no thread free for it
    (:func:`~django_debounce.flow.start_rules.cut_for_start`): later candidates wait behind it."""
    shed_by_key: set[int] = field(default_factory=set)  # shed by their key's bucket (decision 189)


@dataclass(frozen=True)
class Checkpoint:
    """The in-memory state of an :class:`Admission` at one moment (:meth:`Admission.checkpoint`)."""

    rows: dict[str, tuple[Any, ...]]
    """Each held TaskState row's ``_STATE_FIELDS`` values, by task name."""
    admitted: dict[str, int]
    probe_live: dict[str, bool]
    dirty: frozenset[str]
    redis: tuple[int, dict[str, Level], dict[str, int]] = (0, {}, {})
    keys: Any = None  # KeyRows.mark() of the per-key buckets


class Admission:
    """The gate of one claim transaction; create it inside ``transaction.atomic``.

    Args:
        gates: :func:`~django_debounce.flow.rules.current_gates` (non-empty).
        now: the claim's instant (aware datetime; ``timezone.now()``).
        using: database alias.

    Rows locked by :meth:`admit` stay locked until the claim commits;
    :meth:`save` writes the changed ones back and must run before the commit.
    A decision can be taken back before :meth:`save` (:meth:`checkpoint`,
    :meth:`restore`), when the claim could not lock some admitted jobs.

    With ``ledger`` and ``DEBOUNCE_REDIS``, rate-limit tokens are taken in
    Redis (:class:`~django_debounce.flow.redis_tokens.ClaimTokens`; a decision taken back gives
    its tokens back, the caller calls ``ledger.refund_all()`` on rollback) and
    the rows of tasks gated by a rate limit alone are not locked (decision 101).
    """

    def __init__(
        self,
        gates: dict[str, Gate],
        *,
        now: datetime,
        using: str,
        ledger: redis_tokens.TokenLedger | None = None,
    ) -> None:
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
        self._want = 1
        self.keys = KeyRows(gates, now=now, using=using, ledger=ledger)
        buckets = {name: gate.bucket for name, gate in gates.items() if gate.bucket is not None}
        self.redis = redis_tokens.ClaimTokens(
            ledger or redis_tokens.TokenLedger(), buckets if ledger is not None else {}
        )

    def _judged(self, name: str, row: TaskState | None, *, full: bool = False) -> TaskState | None:
        """Return the state :func:`verdict` judges ``name`` by: with a Redis bucket, its level.

        ``full``: the bucket as full, so that the take in Redis decides (a level
        read earlier may be stale: another claim may have given tokens back).
        """
        if name not in self.redis.names:
            return row
        view = copy.copy(row) if row is not None else TaskState(task_name=name)
        level = None if full else self.redis.tokens(name)
        view.tokens = level.tokens if level is not None else None
        view.tokens_at = level.tokens_at if level is not None else None
        return view

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
        self.redis.read_levels()  # Redis failing here: this claim uses the database buckets
        rows = {
            row.task_name: row
            for row in TaskState.objects.using(self.using).filter(task_name__in=names)
        }
        capped = [name for name in names if self.gates[name].concurrency is not None]
        running = self._count_running(capped) if capped else {}
        blocked = set()
        for name in names:
            row = self._judged(name, rows.get(name))
            if row is None:
                continue  # never used: full bucket, closed breaker
            # The probe is not looked up here: a half-open breaker is never called blocked.
            judged = verdict(self.gates[name], row, now=self.now, in_use=running.get(name, 0))
            if judged.kind == "hold":
                blocked.add(name)
        return blocked

    def _count_running(self, names: Sequence[str]) -> dict[str, int]:
        """Return RUNNING jobs under a live lease (``lease_expires_at > now``) per task name."""
        return dict(
            Job.objects.using(self.using)
            .filter(live_lease(self.now), task_name__in=list(names))
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
        for name in list(wanted):
            gate = self.gates[name]
            if gate.breaker is None and gate.concurrency is None:
                if gate.bucket is None or name in self.redis.names:
                    # A Redis rate limit, or rate limits per key, alone: no lock (decisions 101, 189).
                    self.states[name] = TaskState(task_name=name)
                    wanted.remove(name)
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
                    .filter(live_lease(self.now), pk=row.probe_job_id)
                    .exists()
                )

    def hold(self, candidates: Sequence[Job]) -> None:
        """Lock the TaskState and per-key bucket rows of the gated tasks among ``candidates``."""
        self._lock({job.task_name for job in candidates if job.task_name in self.gates})
        self.keys.hold(list(candidates), self.gates)

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
            redis=self.redis.mark(),
            keys=self.keys.mark(),
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
        self.redis.restore(checkpoint.redis)  # Redis tokens go back
        self.keys.restore(checkpoint.keys)

    def admit(
        self,
        candidates: Sequence[Job],
        room: int,
        *,
        start_now: int | None = None,
        judged: JudgedAtStart | None = None,
        plan: bool = False,
    ) -> Decision:
        """Decide, in claim order, which ``candidates`` start (at most ``room``).

        Candidates past ``room`` are held back unexamined. Tokens taken and
        breaker transitions are applied to the locked rows in memory; call
        :meth:`save` before the transaction commits.

        Args:
            candidates: due jobs, in claim order.
            room: most jobs to admit.
            start_now: how many admitted jobs start at once (``None``: all). A job
                ``judged`` at its start is admitted only among the first
                ``start_now``; the round stops before the first one past them
                (``Decision.cut``; decision 146).
            judged: :func:`~django_debounce.flow.start_rules.judged_at_start` of the claim.
            plan: decide which jobs the claim would take without taking Redis
                tokens (a Redis rate limit is judged as if its take succeeded);
                :meth:`restore` afterwards, lock the jobs taken, then decide again
                for real over the locked ones, so a token is taken only for a job
                this claim holds (issue #17 item 5).
        """
        decision = Decision()
        self.hold(candidates)
        pending = Counter(job.task_name for job in candidates)
        for job in candidates:
            if len(decision.admitted) >= room or decision.cut:
                decision.held_back.append(job)
                continue
            if (
                start_now is not None
                and judged is not None
                and len(decision.admitted) >= start_now
                and judged(job)
            ):
                decision.cut = True
                decision.held_back.append(job)
                continue
            # A Redis take asks for the tokens this claim may still use of the task.
            self._want = min(room - len(decision.admitted), pending[job.task_name])
            pending[job.task_name] -= 1
            gate = self.gates.get(job.task_name)
            if gate is None:
                decision.admitted.append(job)
                continue
            verdict = self._check(gate, job, plan=plan)
            if verdict == "admit":
                decision.admitted.append(job)
            elif verdict in ("shed", "shed_key"):
                decision.to_shed.append((job, gate))
                decision.shed_by_key.update([job.pk] if verdict == "shed_key" else [])
            else:
                decision.held_back.append(job)
        return decision

    def _check(self, gate: Gate, job: Job, *, plan: bool = False) -> str:
        """Judge ``job`` by its task's rules (:func:`~django_debounce.flow.rules.verdict`) and apply an admit.

        Returns ``"admit"``, ``"hold"``, ``"shed"`` or ``"shed_key"`` (by its key's bucket). An
        admitted job takes its tokens and may become the breaker's probe, in the locked rows in
        memory. With ``plan``, a Redis take is not made: the job counts as admitted (:meth:`admit`).
        """
        name = gate.task_name
        state = self.states.get(name)
        if state is None or name in self.redis.failed:
            return "hold"  # locked by another claimer right now, or Redis failed in this claim
        judged = verdict(
            gate,
            self._judged(name, state, full=True),
            now=self.now,
            in_use=self._in_use(name),
            probe_live=self.probe_live.get(name, False),
            job_id=job.pk,
        )
        if judged.kind != "admit":
            return judged.kind
        per_key = self.keys.judge(gate, job, plan=plan)  # the key's own bucket (189, 193)
        if per_key is not None:
            return "shed_key" if per_key == "shed" else per_key
        if judged.level is not None and name in self.redis.names:
            # A plan takes nothing: the take is made once the job is locked (issue #17 item 5).
            if not plan and (
                name in self.redis.refused or not self.redis.take(name, self.now, self._want)
            ):
                # No token (Redis said so in this claim), or Redis failed: never shed for that;
                self.keys.give_back(gate, job)  # and a key's token taken in Redis goes back (193).
                return "shed" if gate.drop and name not in self.redis.failed else "hold"
        elif judged.level is not None:
            state.tokens = max(0.0, judged.level - 1)
            # Never move tokens_at back: a claim whose ``now`` was read before it waited for
            # this row's lock must not refill again the time another claim already counted.
            if state.tokens_at is None or state.tokens_at < self.now:
                state.tokens_at = self.now
            self.dirty.add(name)
        self.keys.take(gate, job)
        if judged.probe:
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

    def _in_use(self, name: str) -> int:  # RUNNING under a live lease, plus admitted by this claim
        return self.running.get(name, 0) + self.admitted.get(name, 0)

    def exhausted_names(self) -> set[str]:
        """Return gated names that can admit nothing more in this claim.

        The next candidate round leaves them out. A drop-mode task without
        tokens is not exhausted: its further due jobs are to be shed.
        """
        out = self.unavailable | self.redis.failed
        for name, state in self.states.items():
            judged = verdict(
                self.gates[name],
                self._judged(name, state),
                now=self.now,
                in_use=self._in_use(name),
                probe_live=self.probe_live.get(name, False),
            )
            if judged.kind == "hold":
                out.add(name)
        return out

    def save(self) -> None:
        """Write the TaskState rows this claim changed (one UPDATE each); settle Redis credit."""
        self.redis.settle()
        self.keys.save()
        for name in sorted(self.dirty):
            self.states[name].save(using=self.using, update_fields=_STATE_FIELDS)
        self.dirty.clear()


__all__ = ["CLOSED", "Admission", "Checkpoint", "Decision"]
