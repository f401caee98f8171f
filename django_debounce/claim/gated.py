"""The gated claim: candidates read without locks, admitted, then exactly the taken ones locked (§6).

Once any registered task has a rate limit, a concurrency cap or a circuit
breaker, :func:`django_debounce.claim.claiming.claim_jobs` takes its jobs through
:func:`take_admitted`, inside the claim's transaction. Candidates are read
without row locks (so another worker's claim still finds every job this one
examines but does not take, decision 43); the flow-control gate
(:mod:`django_debounce.flow.admission`) plans which to take; those are locked
(:func:`~django_debounce.claim.queries.lock_due`), and the decision is made for
real over the locked rows, so what runs is what the locked row holds and a
Redis token is taken only for a job the claim holds (issue #17 items 1 and 5,
decision 146).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db.models.sql.query import Query

from .. import compiled
from ..flow import admission
from ..flow.key_rates import not_blocked, shed_reason_per_key
from ..flow.redis_tokens import TokenLedger
from ..flow.rules import Gate, shed_reason
from ..flow.start_rules import JudgedAtStart
from ..lifecycle import shed
from ..models import Job
from .expiry import expire_jobs
from .queries import NOW_SLOT, ClaimShape, lock_due

#: Candidate rounds per gated claim that shed nothing (each round leaves out the
#: task names found exhausted in the previous one).
_MAX_ROUNDS = 4
#: Jobs one gated claim examines at most (shedding rounds continue up to this).
_MAX_EXAMINED = 2000


def take_admitted(
    shape: ClaimShape,
    gates: dict[str, Gate],
    *,
    limit: int,
    now: datetime,
    using: str,
    ledger: TokenLedger | None = None,
    start_now: int | None = None,
    judged: JudgedAtStart | None = None,
) -> list[Job]:
    """Return up to ``limit`` due jobs the flow-control gate admits (§6), in claim order, locked.

    Task names that surely admit nothing (:meth:`Admission.blocked_names`) are
    left out of the candidate query, so a blocked task's backlog does not starve
    other tasks; candidates are oversampled, and a bounded number of further
    rounds leave out the names exhausted meanwhile. Jobs of ``on_excess="drop"``
    tasks without a token are shed here (dead letter ``shed:``, no signal).

    Candidates are read without row locks; only the jobs this claim takes (to
    run, to shed, to expire) are then locked (:func:`~django_debounce.claim.queries.lock_due`), so another
    worker's claim still finds every job this one examined but did not take
    (decision 43 in docs/decisions.md). The jobs returned are the locked rows.

    ``start_now`` and ``judged``: see :func:`claim_jobs` and
    :mod:`django_debounce.flow.start_rules`; a round that stops at a job it cannot
    start ends the claim (no later candidate passes it).
    """
    gate = admission.Admission(gates, now=now, using=using, ledger=ledger)
    skip = gate.blocked_names()
    # Keys whose defer-mode bucket waits for a token are left out of the candidates (decision 189).
    keyed = any(g.key_bucket is not None and not g.drop for g in gates.values())
    unlocked = ClaimShape(queues=shape.queues, busy=shape.busy, lock="", tasks=shape.tasks)
    jobs: list[Job] = []
    seen: list[int] = []  # examined: later rounds leave them out
    idle_rounds = examined = 0
    while idle_rounds < _MAX_ROUNDS and examined < _MAX_EXAMINED:
        room = limit - len(jobs)
        batch = room + max(8, room)
        if seen:  # a later round: its excludes vary, so it stays on the ORM
            round_qs = unlocked.queryset(now, using).exclude(pk__in=seen)
            if keyed:
                round_qs = round_qs.filter(not_blocked(now))
            if skip:
                round_qs = round_qs.exclude(task_name__in=sorted(skip))
            candidates = list(round_qs[:batch])
        else:
            candidates = first_candidates(
                unlocked, tuple(sorted(skip)), batch, now, using, keyed=keyed
            )
        if not candidates:
            break
        read = len(candidates)
        examined += read
        seen.extend(job.pk for job in candidates)
        expired = [
            job.pk for job in candidates if job.expires_at is not None and job.expires_at <= now
        ]
        if expired:
            mine = lock_due(shape, expired, now, using) if shape.lock else set(expired)
            if mine:
                expire_jobs([pk for pk in expired if pk in mine], now=now, using=using)
            candidates = [job for job in candidates if job.pk not in expired]
        decision, lost = _admit_and_lock(
            gate,
            shape,
            candidates,
            room,
            now=now,
            using=using,
            start_now=None if start_now is None else max(0, start_now - len(jobs)),
            judged=judged,
        )
        for job, job_gate in decision.to_shed:
            by_key = job.pk in decision.shed_by_key
            reason, metadata = (shed_reason_per_key if by_key else shed_reason)(job_gate)
            shed(job, reason=reason, metadata=metadata, now=now, using=using)
        jobs.extend(decision.admitted)
        if len(jobs) >= limit or read < batch or decision.cut:
            break
        exhausted = gate.exhausted_names()
        changed = decision.to_shed or expired or lost
        if not (changed or decision.admitted or exhausted - skip):
            break  # nothing changed: the next candidates would fare the same
        if not changed:
            idle_rounds += 1
        skip |= exhausted
    gate.save()
    return jobs


def first_candidates(
    shape: ClaimShape,
    skip: tuple[str, ...],
    batch: int,
    now: datetime,
    using: str,
    *,
    keyed: bool = False,
) -> list[Job]:
    """Return a gated claim's first ``batch`` candidates, not locked, leaving out ``skip`` names.

    The claim query of ``shape`` (no lock) compiled once per (shape, names left
    out, batch, ``keyed``) and alias (:mod:`django_debounce.compiled`). ``keyed``:
    leave out the jobs whose key's defer-mode bucket waits for a token
    (:func:`~django_debounce.flow.key_rates.not_blocked`).
    """

    def build(slot: Mapping[str, Any]) -> Query:
        qs = shape.queryset(slot["now"], using)
        if skip:
            qs = qs.exclude(task_name__in=list(skip))
        if keyed:
            qs = qs.filter(not_blocked(slot["now"]))
        return qs[:batch].query

    key = ("gated_pick", shape, skip, batch, keyed)
    entry = compiled.compiled(key, build, NOW_SLOT, using)
    return compiled.fetch_jobs(entry, {"now": now}, using)


def _admit_and_lock(
    gate: admission.Admission,
    shape: ClaimShape,
    candidates: list[Job],
    room: int,
    *,
    now: datetime,
    using: str,
    start_now: int | None = None,
    judged: JudgedAtStart | None = None,
) -> tuple[admission.Decision, set[int]]:
    """Admit up to ``room`` of ``candidates`` and lock exactly the jobs taken (run or shed).

    First a plan (:meth:`Admission.admit` with ``plan``: no Redis token taken)
    says which jobs the claim would take; those are locked. A planned job that
    another transaction holds or changed since the candidates were read
    (another claim took it, an enqueue slid its window out of due) is lost:
    the plan is taken back (:meth:`Admission.restore`) and made again without
    it. Once every planned job is locked, the decision is made for real over
    the locked rows: the jobs returned are those rows, with the payload and
    counts any enqueue committed before the lock (issue #17 item 1), and a
    Redis token is taken only for a job this claim holds, so a concurrent
    claim never sheds for a token this one gives back (item 5). Returns the
    final decision and the ids lost.
    """
    gate.hold(candidates)
    admit = functools.partial(gate.admit, room=room, start_now=start_now, judged=judged)
    if not shape.lock:  # no row locks (SQLite): the claim has the database, its reads hold
        return admit(candidates), set()
    before = gate.checkpoint()
    lost: set[int] = set()
    while True:
        planned = admit(candidates, plan=True)
        taken = [job.pk for job in planned.admitted] + [job.pk for job, _ in planned.to_shed]
        gate.restore(before)
        if not taken:
            return planned, lost
        locked = lock_due(shape, taken, now, using)
        missing = set(taken) - set(locked)
        if not missing:
            rows = [locked[job.pk] for job in candidates if job.pk in locked]
            return admit(rows), lost
        lost |= missing
        candidates = [job for job in candidates if job.pk not in missing]


__all__ = ["first_candidates", "take_admitted"]
