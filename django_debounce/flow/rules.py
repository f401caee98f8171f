"""The rules that decide whether a READY job may be claimed now, written once (contract §4.5, §6).

Two kinds of rule, each kept here in one form that both the claim and the
admin's "held back by" explanation (:mod:`django_debounce.flow.hold_reasons`) use:

* **Row rules**, as query expressions the claim's SQL applies: the job is due
  (:func:`due`), no other job of its debounce key is RUNNING under a live lease
  or READY and due ahead of it (:func:`jobs_ahead_in_key`), and every
  dependency succeeded (:func:`unmet_dependencies`). :func:`claimable_jobs` is
  the claim's candidate query built from them; the admin explains them for
  one job from what those same predicates find
  (:func:`django_debounce.flow.hold_reasons.row_holds`).
* **Flow-control rules** of a task (its :class:`Gate`: circuit breaker,
  concurrency cap, rate limit), as the pure function :func:`verdict`: admit,
  hold or shed, with every reason and until when. The claim's admission
  (:mod:`django_debounce.flow.admission`) acts on the verdict under row locks; the
  admin shows its reasons.

Nothing here writes, locks or (except :func:`claimable_jobs` and the
predicates, which only build querysets) touches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.expressions import Combinable
from django.utils import timezone

from .. import registry
from ..breaker import HALF_OPEN, OPEN, CircuitBreaker
from ..models import Job, JobDependency, TaskState
from .throttle import EPSILON, TokenBucket, bucket_for

if TYPE_CHECKING:
    from ..options import TaskOptions

Status = Job.Status

# -- row rules: query expressions --------------------------------------------------------


def live_lease(now: datetime | Combinable) -> Q:
    """Return the filter of jobs RUNNING under a live lease at ``now`` (``lease_expires_at > now``).

    Such a job counts against its task's concurrency cap, holds back the other
    jobs of its debounce key, and, as a half-open breaker's probe, keeps the
    breaker's other jobs waiting (§4.5, §6). A lapsed lease counts for none of
    these: its worker is presumed dead.
    """
    return Q(status=Status.RUNNING, lease_expires_at__gt=now)


def due(now: datetime | Combinable) -> Q:
    """Return the filter of READY jobs whose ``run_at`` has come (``run_at <= now``, §11)."""
    return Q(status=Status.READY, run_at__lte=now)


def jobs_ahead_in_key(
    now: datetime | Combinable,
    *,
    key_hash: str | OuterRef,
    pk: int | OuterRef,
    run_at: datetime | OuterRef,
) -> QuerySet[Job]:
    """Return the jobs of a debounce key that hold back the job ``(key_hash, pk, run_at)`` (§4.5).

    Another job of the same key that is RUNNING under a live lease, or READY
    and ahead of it in line (an earlier ``run_at``, or the same ``run_at`` and
    a smaller id).

    Args:
        now: the claim's instant (aware datetime, or an expression).
        key_hash, pk, run_at: the held job's values, or ``OuterRef("key_hash")``
            etc. to use it as the correlated subquery of the claim.
    """
    return (
        Job.objects.filter(key_hash=key_hash)
        .exclude(pk=pk)
        .filter(
            live_lease(now)
            | Q(status=Status.READY, run_at__lt=run_at)
            | Q(status=Status.READY, run_at=run_at, pk__lt=pk)
        )
    )


def unmet_dependencies(job: int | OuterRef) -> QuerySet[JobDependency]:
    """Return the dependency links of ``job`` (an id or ``OuterRef("pk")``) not SUCCESSFUL yet (§6)."""
    return JobDependency.objects.filter(job=job).exclude(dependency__status=Status.SUCCESSFUL)


def claimable_jobs(
    now: datetime | Combinable, queues: Sequence[str] | None = None
) -> QuerySet[Job]:
    """Return the queryset of jobs a worker may claim at ``now``, in claim order.

    Due (``run_at <= now``), READY, in ``queues`` (all when ``None`` or
    empty), and not held back by another job of the same debounce key that is
    RUNNING under a live lease or READY and due ahead of it (§4.5), nor by a
    dependency that has not succeeded yet (§6; a job without dependencies costs
    one probe of the ``JobDependency.job`` index). Ordered by priority
    (highest first), then ``run_at``, then id. Flow control (:func:`verdict`)
    is applied to these candidates afterwards.
    """
    ahead = jobs_ahead_in_key(
        now, key_hash=OuterRef("key_hash"), pk=OuterRef("pk"), run_at=OuterRef("run_at")
    )
    qs = Job.objects.filter(due(now))
    if queues:
        qs = qs.filter(queue__in=list(queues))
    qs = qs.filter(Q(key_hash__isnull=True) | ~Exists(ahead))
    qs = qs.filter(~Exists(unmet_dependencies(OuterRef("pk"))))
    return qs.order_by("-priority", "run_at", "id")


# -- reasons ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """One reason a READY job is not claimed now.

    Attributes:
        code: ``"not_due"``, ``"expired"``, ``"dependency"``, ``"key"``,
            ``"breaker"``, ``"probe"``, ``"concurrency"``, ``"rate_limit"``, ``"key_rate_limit"``
            (its key's bucket), ``"shed"`` (drop-mode bucket empty: the next claim sheds it) or
            ``"unknown_task"`` (not registered here: flow control unknown).
        text: the reason in operators' words (plain text).
        job_id: a related job (the dependency, the run of the key, the probe), or ``None``.
        until: when this hold ends at the earliest, if known.
    """

    code: str
    text: str
    job_id: int | None = None
    until: datetime | None = None


def when_text(value: datetime) -> str:
    """Return ``value`` in the current time zone as ``YYYY-MM-DD HH:MM:SS`` (for reasons)."""
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


# -- flow-control rules: the gate and its verdict -----------------------------------------


@dataclass(frozen=True)
class Gate:
    """The flow-control options of one task name, as the claim sees them (§6).

    Attributes:
        task_name: the task's registered name.
        bucket: its token bucket, or ``None`` without ``rate_limit=``.
        drop: ``on_excess="drop"``: a job with no token is shed, not deferred.
        concurrency: the cap on RUNNING jobs, or ``None``.
        breaker: the circuit breaker, or ``None``.
        key_bucket: the shape of each debounce key's bucket (``rate_limit_per_key=``), or ``None``.
    """

    task_name: str
    bucket: TokenBucket | None
    drop: bool
    concurrency: int | None
    breaker: CircuitBreaker | None
    key_bucket: TokenBucket | None = None


def gate_for(name: str, options: TaskOptions) -> Gate | None:
    """Return the :class:`Gate` of a task's options, or ``None`` when nothing gates it."""
    per_key = options.rate_limit_per_key
    if options.rate_limit is None and per_key is None and not options.concurrency:
        if not options.circuit_breaker:
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
        key_bucket=bucket_for(per_key) if per_key is not None else None,
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


def task_gate(task_name: str) -> tuple[Gate | None, bool]:
    """Return ``(gate, registered)`` of ``task_name`` in this process's registry (no query)."""
    task = registry.lookup(task_name)
    if task is None:
        return None, False
    return gate_for(task_name, task.options), True


def shed_reason(gate: Gate) -> tuple[str, dict[str, Any]]:
    """Return the dead letter's ``(reason, metadata)`` for a job dropped by ``gate``'s rate limit (§6)."""
    assert gate.bucket is not None
    text = gate.bucket.text
    return (
        f"shed: rate limit {text} exceeded",
        {"shed": True, "rate_limit": text, "capacity": gate.bucket.capacity},
    )


def next_token_at(bucket: TokenBucket, level: float, now: datetime) -> datetime | None:
    """Return when a bucket at ``level`` now next holds a whole token; ``None`` if it holds one.

    The refill is continuous (§6, token bucket): after ``(1 - level) / per_second`` seconds.
    """
    if level >= 1 - EPSILON:
        return None
    return now + timedelta(seconds=(1 - level) / bucket.per_second)


Kind = Literal["admit", "hold", "shed"]


class _Reason(NamedTuple):
    """A reason found by :func:`verdict`, its text written only if someone reads it."""

    code: str
    text: Callable[[], str]
    job_id: int | None = None
    until: datetime | None = None


@dataclass
class Verdict:
    """What a task's flow control says of one job at one instant (:func:`verdict`).

    Treat it as read-only (not frozen only because the claim makes one per
    candidate, and a plain dataclass is built several times faster).

    Attributes:
        kind: ``"admit"`` (the job may start), ``"hold"`` (it stays READY with
            its ``run_at``) or ``"shed"`` (an ``on_excess="drop"`` job without
            a token: it is dead-lettered ``shed:``).
        probe: when admitted, whether the job runs as the breaker's probe
            (the breaker turns half-open).
        level: the token bucket's level at the instant, or ``None`` without a
            rate limit.
    """

    kind: Kind
    found: tuple[_Reason, ...] = ()
    probe: bool = False
    level: float | None = None

    @cached_property
    def reasons(self) -> tuple[Hold, ...]:
        """Why not ``"admit"``, in rule order (breaker, concurrency, rate limit); empty when admitted.

        The first decides the kind. The texts are written here, on first
        read (the claim never reads them), in the current time zone.
        """
        return tuple(Hold(r.code, r.text(), r.job_id, r.until) for r in self.found)

    @property
    def until(self) -> datetime | None:
        """When the deciding reason ends at the earliest, if known."""
        return self.found[0].until if self.found else None


def verdict(
    gate: Gate,
    state: TaskState | None,
    *,
    now: datetime,
    in_use: int = 0,
    probe_live: bool = False,
    job_id: int | None = None,
    every: bool = False,
) -> Verdict:
    """Decide whether ``gate``'s task may start one more job at ``now`` (§6; pure, no query).

    The rules, in this order (the first that holds decides):

    * **circuit breaker**: open before ``opened_at + reset``
      (:meth:`~django_debounce.breaker.CircuitBreaker.probe_due_at`), or with no
      opening time stored, holds; open after it admits the job as the probe;
      half-open holds while the probe is RUNNING under a live lease
      (``probe_live``), else the job becomes the new probe.
    * **concurrency**: ``in_use`` at or above the cap holds.
    * **rate limit**: a bucket without a whole token holds the job, or sheds
      it for ``on_excess="drop"`` (a breaker never sheds).

    Args:
        gate: the task's flow-control options.
        state: its ``TaskState`` row as read (not changed here), or ``None``
            when it has none (a full bucket, a closed breaker).
        now: the instant to judge at (aware datetime).
        in_use: the task's RUNNING jobs under a live lease plus those the
            current claim already admitted.
        probe_live: whether the half-open breaker's probe job is still RUNNING
            under a live lease.
        job_id: the job judged, if any; the live probe never holds itself.
        every: list every reason that applies (the admin), instead of
            stopping at the first (the claim).

    Returns:
        A :class:`Verdict`.
    """
    found: list[_Reason] = []
    probe = False
    if gate.breaker is not None and state is not None:
        breaker_state = state.breaker_state
        if breaker_state == OPEN:
            probe_at = gate.breaker.probe_due_at(state)
            if probe_at is None:
                found.append(
                    _Reason("breaker", lambda: "circuit breaker open (no opening time stored)")
                )
            elif now < probe_at:
                failures = state.failures
                found.append(
                    _Reason(
                        "breaker",
                        lambda: (
                            f"circuit breaker open until {when_text(probe_at)} "
                            f"({failures} consecutive failures); then one job runs as the probe"
                        ),
                        until=probe_at,
                    )
                )
            else:
                probe = True
        elif breaker_state == HALF_OPEN:
            probe_id = state.probe_job_id
            if probe_live and probe_id != job_id:
                found.append(
                    _Reason(
                        "probe",
                        lambda: f"circuit breaker half-open: probe #{probe_id} is running",
                        job_id=probe_id,
                    )
                )
            else:
                probe = True
    if found and not every:
        return Verdict("hold", tuple(found))
    cap = gate.concurrency
    if cap is not None and in_use >= cap:
        found.append(
            _Reason("concurrency", lambda: f"concurrency cap full ({in_use}/{cap} running)")
        )
        if not every:
            return Verdict("hold", tuple(found))
    level = None
    bucket = gate.bucket
    if bucket is not None:
        level = bucket.level(
            state.tokens if state is not None else None,
            state.tokens_at if state is not None else None,
            now,
        )
        token_at = next_token_at(bucket, level, now)
        if token_at is not None:
            if gate.drop:
                found.append(
                    _Reason(
                        "shed",
                        lambda: (
                            f"no token (rate limit {bucket.text}, on_excess='drop'): a claim "
                            f"before ~{when_text(token_at)} sheds it"
                        ),
                        until=token_at,
                    )
                )
            else:
                found.append(
                    _Reason(
                        "rate_limit",
                        lambda: f"no token until ~{when_text(token_at)} (rate limit {bucket.text})",
                        until=token_at,
                    )
                )
    if not found:
        return Verdict("admit", probe=probe, level=level)
    kind: Kind = "shed" if found[0].code == "shed" else "hold"
    return Verdict(kind, tuple(found), level=level)


__all__ = [
    "Gate",
    "Hold",
    "Verdict",
    "claimable_jobs",
    "current_gates",
    "due",
    "gate_for",
    "jobs_ahead_in_key",
    "live_lease",
    "next_token_at",
    "shed_reason",
    "task_gate",
    "unmet_dependencies",
    "verdict",
]
