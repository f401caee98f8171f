"""Why a READY job is not being claimed, and a task's flow-control state now (contract §4.5, §6).

Read-only diagnostics for the admin (issue #4; documented as
``django_debounce.holds``, which stays an alias of this module):
:func:`held_back` lists what holds one READY job back. It asks the claim's own
rules (:mod:`django_debounce.flow.rules`): the row predicates the claim
query is built from (due, no earlier run of its key in flight, every
dependency successful) and the flow-control :func:`~django_debounce.flow.rules.verdict`
(circuit breaker, concurrency cap, rate limit), so the explanation cannot
drift from the claim. :func:`flow_view` describes one task's
:class:`~django_debounce.models.TaskState` row as of now (token level with the
bucket math of :mod:`django_debounce.flow.throttle`).

Nothing here writes or locks; each function makes a small, fixed number of
indexed queries. The answer is a snapshot: a worker's claim decides under
row locks a moment later and may see a different state.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from ..breaker import HALF_OPEN
from ..models import Job, TaskState
from .key_rates import bucket_row, key_hold
from .redis_buckets import RedisUnavailable, store
from .rules import (
    Gate,
    Hold,
    jobs_ahead_in_key,
    live_lease,
    next_token_at,
    task_gate,
    unmet_dependencies,
    verdict,
)
from .rules import when_text as _when

Status = Job.Status


def with_redis_level(
    task_name: str, gate: Gate | None, state: TaskState | None
) -> TaskState | None:
    """Return ``state`` with the live Redis bucket level when ``DEBOUNCE_REDIS`` holds it.

    With the bucket in Redis (decision 104) the row's ``tokens`` are not the
    bucket's: a copy of the row (or a blank row) gets Redis's level. Without
    ``DEBOUNCE_REDIS``, without a rate limit, or while Redis does not answer,
    ``state`` is returned as it is (the claim then uses that database bucket too).
    """
    found = store() if gate is not None and gate.bucket is not None else None
    if found is None or gate is None or gate.bucket is None:
        return state
    try:
        level = found.levels({task_name: gate.bucket})[task_name]
    except RedisUnavailable:
        return state
    view = copy.copy(state) if state is not None else TaskState(task_name=task_name)
    view.tokens, view.tokens_at = level.tokens, level.tokens_at
    return view


@dataclass(frozen=True)
class FlowView:
    """One task's flow-control state at ``now`` (what the claim's gate would see, §6).

    Attributes:
        task_name: the task's registered name.
        gate: its flow-control options (:class:`~django_debounce.flow.rules.Gate`), or ``None`` when
            the task declares none or is not registered in this process.
        registered: whether this process knows the task (otherwise the rate and cap
            are unknown here and only the stored row is shown).
        breaker_state: ``"closed"``, ``"open"`` or ``"half_open"``.
        failures: consecutive failed runs.
        opened_at: when the breaker last opened, or ``None``.
        reset_due_at: while open, when one probe may run (``opened_at + reset``);
            else ``None``.
        probe_job_id: while half-open, the probe's job id.
        tokens: the bucket's level at ``now`` (float, 0..capacity), or ``None``
            without a rate limit.
        capacity: the bucket's capacity, or ``None``.
        next_token_at: when the bucket next holds a whole token, ``None`` if it
            holds one now or there is no rate limit.
        running: RUNNING jobs of the task under a live lease, or ``None`` when not
            counted (no cap, or not given).
        cap: the concurrency cap, or ``None``.
    """

    task_name: str
    gate: Gate | None
    registered: bool
    breaker_state: str
    failures: int
    opened_at: datetime | None
    reset_due_at: datetime | None
    probe_job_id: int | None
    tokens: float | None
    capacity: int | None
    next_token_at: datetime | None
    running: int | None
    cap: int | None


def flow_view(
    task_name: str, state: TaskState | None, *, now: datetime, running: int | None = None
) -> FlowView:
    """Describe ``task_name``'s flow-control state at ``now`` (no query; one Redis read with ``DEBOUNCE_REDIS``).

    Args:
        task_name: the task's name.
        state: its ``TaskState`` row, or ``None`` when it has none (a full
            bucket and a closed breaker).
        now: the instant to evaluate at (aware datetime).
        running: RUNNING jobs under a live lease, if the caller counted them.

    Returns:
        A :class:`FlowView`. The token level is
        :meth:`~django_debounce.flow.throttle.TokenBucket.level` of the stored ``tokens`` at
        ``tokens_at`` (§6, token bucket); the next token comes after
        ``(1 - level) / per_second`` seconds. With the bucket in Redis, the
        level is Redis's (``with_redis_level``).
    """
    gate, registered = task_gate(task_name)
    state = with_redis_level(task_name, gate, state)
    breaker_state = state.breaker_state if state is not None else TaskState.BreakerState.CLOSED
    opened_at = state.opened_at if state is not None else None
    reset_due_at = None
    if gate is not None and gate.breaker is not None and state is not None:
        reset_due_at = gate.breaker.probe_due_at(state)
    tokens = capacity = token_at = None
    if gate is not None and gate.bucket is not None:
        bucket = gate.bucket
        capacity = bucket.capacity
        tokens = bucket.level(
            state.tokens if state else None, state.tokens_at if state else None, now
        )
        token_at = next_token_at(bucket, tokens, now)
    return FlowView(
        task_name=task_name,
        gate=gate,
        registered=registered,
        breaker_state=str(breaker_state),
        failures=state.failures if state is not None else 0,
        opened_at=opened_at,
        reset_due_at=reset_due_at,
        probe_job_id=state.probe_job_id if state is not None else None,
        tokens=tokens,
        capacity=capacity,
        next_token_at=token_at,
        running=running,
        cap=gate.concurrency if gate is not None else None,
    )


def count_running(task_name: str, *, now: datetime, using: str = DEFAULT_DB_ALIAS) -> int:
    """Return the task's RUNNING jobs under a live lease (``lease_expires_at > now``), as the cap counts."""
    return Job.objects.using(using).filter(live_lease(now), task_name=task_name).count()


def row_holds(
    job: Job,
    *,
    now: datetime,
    waiting: Sequence[tuple[int, str]],
    ahead: Sequence[tuple[int, str]],
) -> list[Hold]:
    """Explain the row rules of :func:`~django_debounce.flow.rules.claimable_jobs` for the READY ``job`` (pure).

    Args:
        job: a READY job.
        now: the instant to judge at (aware datetime).
        waiting: ``(id, status)`` of its dependencies not SUCCESSFUL yet
            (:func:`~django_debounce.flow.rules.unmet_dependencies`), in id order.
        ahead: ``(id, status)`` of the jobs of its key ahead of it
            (:func:`~django_debounce.flow.rules.jobs_ahead_in_key`), in id order.

    Returns:
        list[Hold]: in this order: not due until ``run_at``; expired (the next claim ends
        it EXPIRED, §6); each dependency not successful; another run of its key
        in flight, else an earlier job of its key due ahead of it (§4.5).
    """
    holds: list[Hold] = []
    if job.run_at > now:
        holds.append(Hold("not_due", f"not due until {_when(job.run_at)}", until=job.run_at))
    if job.expires_at is not None and job.expires_at <= now:
        holds.append(
            Hold(
                "expired",
                f"expired at {_when(job.expires_at)}: the next claim ends it EXPIRED, unrun",
            )
        )
    for pk, status in waiting:
        holds.append(
            Hold("dependency", f"dependency not yet successful: #{pk} ({status})", job_id=pk)
        )
    running = [pk for pk, status in ahead if status == Status.RUNNING]
    if running:
        holds.append(
            Hold("key", f"another run of its key in flight: #{running[0]}", job_id=running[0])
        )
    elif ahead:
        pk = ahead[0][0]
        holds.append(Hold("key", f"an earlier job of its key is due ahead of it: #{pk}", pk))
    return holds


def held_back(
    job: Job, *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> list[Hold]:
    """Return what holds the READY ``job`` back at ``now``; ``[]`` when nothing does.

    Mirrors the claim (§4.5, §6): not due yet; expired (the next claim ends it
    EXPIRED); a dependency not SUCCESSFUL yet; another job of its debounce key
    RUNNING under a live lease or READY and due ahead of it; then, for a task
    with flow control, an open breaker before its reset, a half-open breaker
    whose probe is still running, a full concurrency cap, an empty token
    bucket. Every applicable hold is listed (not only the first the claim
    would hit). A job that is not READY has no holds.

    Args:
        job: a ``Job`` row.
        now: the instant to judge at (aware datetime); default ``timezone.now()``.
        using: database alias.

    Returns:
        A list of :class:`Hold`, in the order above. At most five queries:
        dependencies, the key, the task's state row, its running count, its probe.
    """
    if job.status != Status.READY:
        return []
    now = now or timezone.now()
    waiting = list(
        unmet_dependencies(job.pk)
        .using(using)
        .order_by("dependency_id")
        .values_list("dependency_id", "dependency__status")[:5]
    )
    ahead: list[tuple[int, str]] = []
    if job.key_hash is not None:
        ahead = list(
            jobs_ahead_in_key(now, key_hash=job.key_hash, pk=job.pk, run_at=job.run_at)
            .using(using)
            .order_by("pk")
            .values_list("pk", "status")[:5]
        )
    holds = row_holds(job, now=now, waiting=waiting, ahead=ahead)
    holds.extend(_gate_holds(job, now, using))
    return holds


def _gate_holds(job: Job, now: datetime, using: str) -> list[Hold]:
    """The flow-control holds of ``job``'s task (§6): every reason of the claim's verdict."""
    gate, registered = task_gate(job.task_name)
    if not registered:
        return [
            Hold(
                "unknown_task",
                f"task {job.task_name!r} is not registered in this process: a worker that does "
                "not know it either dead-letters it (unknown_task:); flow control not shown",
            )
        ]
    if gate is None:
        return []
    state = TaskState.objects.using(using).filter(task_name=job.task_name).first()
    state = with_redis_level(job.task_name, gate, state)
    running = count_running(job.task_name, now=now, using=using) if gate.concurrency else 0
    probe_live = False
    if (
        gate.breaker is not None
        and state is not None
        and state.breaker_state == HALF_OPEN
        and state.probe_job_id is not None
    ):
        probe_live = (
            Job.objects.using(using).filter(live_lease(now), pk=state.probe_job_id).exists()
        )
    judged = verdict(
        gate, state, now=now, in_use=running, probe_live=probe_live, job_id=job.pk, every=True
    )
    holds = list(judged.reasons)
    if gate.key_bucket is not None and job.key_hash is not None:  # decision 189
        key = key_hold(gate, bucket_row(job.task_name, job.key_hash, using=using), now)
        holds.extend([key] if key is not None else [])
    return holds


def flow_control_notes(
    task_names: list[str], *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> dict[str, str]:
    """Return, per gated task in ``task_names``, what flow control still applies at claim.

    For the admin's "Run now" message: run now moves ``run_at`` only; a
    circuit breaker, a concurrency cap and a rate limit still gate the claim
    (§6). Tasks without flow control (or unknown here) are left out. At most
    two queries: the state rows, and the running counts of capped tasks.

    Returns:
        ``{task_name: text}``, e.g. ``"circuit breaker open until 12:05:00"`` or
        ``"rate limit 10/s, concurrency cap 2 (applied when a worker claims it)"``.
    """
    now = now or timezone.now()
    gates: dict[str, Gate] = {}
    for name in sorted(set(task_names)):
        gate = task_gate(name)[0]
        if gate is not None:
            gates[name] = gate
    if not gates:
        return {}
    states = {
        row.task_name: row
        for row in TaskState.objects.using(using).filter(task_name__in=list(gates))
    }
    capped = [name for name, gate in gates.items() if gate.concurrency is not None]
    running: dict[str, int] = {}
    if capped:
        for name in (
            Job.objects.using(using)
            .filter(live_lease(now), task_name__in=capped)
            .values_list("task_name", flat=True)[:10_000]
        ):
            running[name] = running.get(name, 0) + 1
    notes: dict[str, str] = {}
    for name, gate in gates.items():
        view = flow_view(name, states.get(name), now=now, running=running.get(name, 0))
        now_parts: list[str] = []
        if view.reset_due_at is not None and now < view.reset_due_at:
            now_parts.append(f"its circuit breaker is open until {_when(view.reset_due_at)}")
        elif view.breaker_state == HALF_OPEN:
            now_parts.append("its circuit breaker is half-open (a probe runs)")
        if gate.concurrency is not None and (view.running or 0) >= gate.concurrency:
            now_parts.append(f"its concurrency cap is full ({view.running}/{gate.concurrency})")
        if view.next_token_at is not None:
            now_parts.append(f"no token until ~{_when(view.next_token_at)}")
        declared = [
            text
            for text in (
                "a circuit breaker" if gate.breaker else "",
                f"a concurrency cap of {gate.concurrency}" if gate.concurrency else "",
                f"a rate limit of {gate.bucket.text}" if gate.bucket else "",
                f"a rate limit per key of {gate.key_bucket.text}" if gate.key_bucket else "",
            )
            if text
        ]
        note = "has " + ", ".join(declared) + ", applied when a worker claims it"
        if now_parts:
            note += "; right now " + ", ".join(now_parts)
        notes[name] = note
    return notes


__all__ = [
    "FlowView",
    "Hold",
    "count_running",
    "flow_control_notes",
    "flow_view",
    "held_back",
    "row_holds",
    "task_gate",
]
