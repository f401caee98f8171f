"""The reference model of the contract the state machine checks the package against (pure Python).

No Django here: times are seconds after the base instant T (floats that are
multiples of 0.5, so every comparison is exact), job ids are the ones the
package returned. The model predicts what the contract fixes exactly (which
window an enqueue joins, a slide's deadline, the payload a window holds, a
retry's due time, what a lapsed lease, a release, a prune or a dead-letter
retry leaves) and *judges* what the contract leaves to the implementation
(which due jobs a claim takes, in which order): a claim's choice is checked
against the rules that must hold when a job is claimed and when it starts
(:meth:`Model.check_claim`, :meth:`Model.hand_over`).

What it does not model: CoDel, circuit breakers, dependencies, priorities
(every job has priority 0) and a Redis outage; see README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .buckets import Buckets
from .edges import EdgeRules
from .records import (
    CANCELLED,
    EXPIRED,
    FAILED,
    FINISHED,
    READY,
    RUNNING,
    SHED,
    SUCCESSFUL,
    MJob,
    MLetter,
    Spec,
    ViolationError,
)


@dataclass
class Model(EdgeRules):
    """The whole expected state, and the rules that judge what the package chose."""

    specs: dict[str, Spec]
    lease: float = 60.0
    jobs: dict[int, MJob] = field(default_factory=dict)
    letters: list[MLetter] = field(default_factory=list)
    buckets: Buckets = field(default_factory=Buckets)  # rate limits, task-wide and per key
    running: dict[int, str] = field(default_factory=dict)  # started, alive: job -> worker
    now: float = 0.0  # the instant of the call being predicted (the edge rules read it)

    # -- enqueue -----------------------------------------------------------------------------
    def predict_enqueue(self, task: str, key: str) -> tuple[str, int | None]:
        """Return ``(outcome, job id or None for a new job)`` for one call (§4, §6 coalesce)."""
        spec = self.specs[task]
        if spec.edge != "trailing":
            return self._predict_edge(spec, key)
        for job in self.jobs.values():
            if job.task != task or job.key != key:
                continue
            if spec.debounced and job.open:
                return "debounced", job.id
            if spec.payload == "unique" and job.status in (READY, RUNNING):
                return "coalesced", job.id
        return "created", None

    def apply_enqueue(
        self, task: str, key: str, args: list[Any], now: float, outcome: str, job_id: int
    ) -> MJob:
        """Apply one call the package made ``outcome`` on ``job_id``; raise if not the model's."""
        self.now = now
        expected, known = self.predict_enqueue(task, key)
        if outcome != expected or (known is not None and known != job_id):
            raise ViolationError(
                f"enqueue {task}[{key}] at {now}: got {outcome} #{job_id}, "
                f"model says {expected} #{known}"
            )
        spec = self.specs[task]
        if spec.edge != "trailing":
            return self._apply_edge(spec, key, args, now, outcome, job_id)
        if outcome == "created":
            if job_id in self.jobs:
                raise ViolationError(f"enqueue {task}[{key}] created #{job_id}, an id already used")
            job = MJob(
                id=job_id,
                task=task,
                key=key if spec.debounced or spec.payload == "unique" else None,
                payload=args,
                run_at=now + spec.window if spec.debounced else now,
                max_retries=spec.max_retries,
                expires_at=None if spec.expires is None else now + spec.expires,
            )
            if spec.debounced:
                job.open, job.opened_at, job.max_run_at = True, now, now + spec.max_wait
                job.last_call = now
            self.jobs[job_id] = job
            return job
        job = self.jobs[job_id]
        if outcome == "debounced":
            assert job.max_run_at is not None
            job.run_at = min(now + spec.window, job.max_run_at)
            job.enqueue_count += 1
            job.last_call = now
            if spec.payload == "replace":
                job.payload = args
            elif spec.payload == "merge":
                ids = list(job.payload[1])
                job.payload = [job.payload[0], ids + [i for i in args[1] if i not in ids]]
        return job

    # -- claim and start ---------------------------------------------------------------------
    def check_claim(
        self,
        worker: str,
        claimed: list[int],
        expired: list[int],
        shed: list[int],
        now: float,
        start_now: int | None,
    ) -> None:
        """Judge one claim's choice against the rules at claim time, then apply it.

        ``claimed`` in claim order; ``expired``/``shed``: READY jobs the claim
        ended. Each claimed job was READY and due, not held by its key (§4.5),
        and a job of a gated task is among the first ``start_now`` (decision 146
        is judged where it matters, at the start: see :meth:`hand_over`).
        """
        before = {pk: (job.status, job.lease_until) for pk, job in self.jobs.items()}
        for pk in expired:
            job = self._ready(pk, now, "expired by a claim")
            if job.expires_at is None or job.expires_at > now:
                raise ViolationError(f"claim at {now} expired #{pk}, expires at {job.expires_at}")
            self._end(job, EXPIRED, now)
        taken_now = {
            scope
            for pk in claimed
            if pk in self.jobs
            for scope, _, _ in self.buckets.scopes(self.specs[self.jobs[pk].task], self.jobs[pk])
        }
        for pk in shed:
            job = self._ready(pk, now, "shed by a claim")
            spec = self.specs[job.task]
            if not spec.drop:
                raise ViolationError(f"claim at {now} shed #{pk} of {job.task}, not a drop task")
            reason = self.buckets.shed_reason(spec, job, now, taken_now)
            if reason is None:
                takes = {
                    scope: self.buckets.takes.get(scope)
                    for scope, _, _ in Buckets.scopes(spec, job)
                }
                raise ViolationError(
                    f"claim at {now} shed #{pk} ({job.task}[{job.key}]): its buckets had a "
                    f"token (takes {takes}, claimed {claimed}, shed {shed})"
                )
            self._end(job, SHED, now)
            self.letters.append(MLetter(pk, job.task, list(job.payload), reason))
        keys: set[tuple[str, str]] = set()
        for pk in claimed:
            job = self._ready(pk, now, "claimed")
            if job.expires_at is not None and job.expires_at <= now:
                raise ViolationError(f"claim at {now} took #{pk}, expired at {job.expires_at}")
            spec = self.specs[job.task]
            if spec.debounced:
                assert job.key is not None
                if (job.task, job.key) in keys or self._key_held(job, now, before):
                    raise ViolationError(
                        f"claim at {now} took #{pk} while its key {job.key} was held"
                    )
                keys.add((job.task, job.key))
            refused = self.buckets.take(spec, job, now)
            if refused is not None:
                raise ViolationError(f"claim at {now} took #{pk} of {job.task}: {refused}")
            job.status, job.open, job.worker = RUNNING, False, worker
            job.lease_until, job.attempts, job.started = now + self.lease, job.attempts + 1, False
            job.started_before, job.started_at = job.started_at, now

    def letters_of(self, pk: int) -> str:
        """The kinds of ``pk``'s dead letters, joined (for the run's counters)."""
        return " ".join(letter.kind for letter in self.letters if letter.job_id == pk)

    def _ready(self, pk: int, now: float, what: str) -> MJob:
        job = self.jobs.get(pk)
        if job is None or job.status != READY or job.run_at > now:
            state = None if job is None else (job.status, job.run_at)
            raise ViolationError(f"#{pk} {what} at {now} but the model has it {state}")
        return job

    def _key_held(self, job: MJob, now: float, before: dict[int, Any]) -> bool:
        for other in self.jobs.values():
            if other.id == job.id or other.task != job.task or other.key != job.key:
                continue
            status, lease = before.get(other.id, (other.status, other.lease_until))
            if status == RUNNING and lease is not None and lease > now:
                return True
            if status == READY and (other.run_at, other.id) < (job.run_at, job.id):
                return True
        return False

    def hand_over(self, pk: int, worker: str, now: float, started: bool) -> None:
        """Judge the hand-over of a claimed job to a thread at ``now`` (§6, decision 146).

        Past its expiry it must not start (EXPIRED, attempt taken back); a start
        must keep the task's concurrency cap and its rates, task-wide and per
        key (starts of a bucket in any interval ``[a, b]`` at most capacity +
        refill over ``b - a``; :meth:`.Buckets.start`).
        """
        job = self.jobs[pk]
        if job.status != RUNNING or job.worker != worker or job.started:
            raise ViolationError(
                f"hand-over of #{pk} to {worker}, model has {job.status}/{job.worker}"
            )
        if job.expires_at is not None and job.expires_at <= now:
            if started:
                raise ViolationError(f"#{pk} started at {now}, past its expiry {job.expires_at}")
            job.attempts -= 1
            job.started_at = job.started_before
            self._end(job, EXPIRED, now)
            return
        if not started:
            raise ViolationError(f"#{pk} was not started at {now}; the model expected it to start")
        spec = self.specs[job.task]
        job.started = True
        self.running[pk] = worker
        if spec.concurrency is not None:
            alive = sum(1 for other in self.running if self.jobs[other].task == job.task)
            if alive > spec.concurrency:
                raise ViolationError(f"#{pk} started at {now}: {alive} runs of {job.task} at once")
        broken = self.buckets.start(spec, job, now)
        if broken is not None:
            raise ViolationError(f"#{pk} started at {now}: {broken}")

    # -- outcomes ----------------------------------------------------------------------------
    def finish(self, pk: int, ok: bool, now: float) -> None:
        """A started run ended: success, or a failure (retry after backoff, or dead letter)."""
        job = self.jobs[pk]
        assert job.started and job.status == RUNNING, (pk, job)
        self.running.pop(pk, None)
        job.runs += 1
        job.started = False
        if ok:
            self._end(job, SUCCESSFUL, now)
        elif job.attempts > job.max_retries:
            self._end(job, FAILED, now)
            self.letters.append(MLetter(pk, job.task, list(job.payload), "failed"))
        else:
            spec = self.specs[job.task]
            job.status, job.worker, job.lease_until = READY, "", None
            job.run_at = now + spec.backoff(job.attempts)

    def _end(self, job: MJob, status: str, now: float) -> None:
        job.status, job.finished_at, job.open = status, now, False
        job.worker, job.lease_until, job.started = "", None, False
        self.running.pop(job.id, None)

    def kill(self, worker: str) -> None:
        """The worker's process died: its runs stop; its jobs stay RUNNING until their leases lapse."""
        for pk in [pk for pk, w in self.running.items() if w == worker]:
            del self.running[pk]

    def renew(self, ids: list[int], now: float) -> None:
        for pk in ids:
            self.jobs[pk].lease_until = now + self.lease

    def reclaim(self, now: float) -> tuple[int, int]:
        """Lapsed leases (§7, §11): back to READY keeping ``run_at``, or FAILED after the last retry."""
        requeued = lettered = 0
        for job in self.jobs.values():
            if job.status != RUNNING or job.lease_until is None or job.lease_until > now:
                continue
            if job.id in self.running:
                raise ViolationError(f"#{job.id}'s lease lapsed at {now} while its run is alive")
            if job.attempts <= job.max_retries:
                job.status, job.worker, job.lease_until, job.started = READY, "", None, False
                requeued += 1
            else:
                self._end(job, FAILED, now)
                self.letters.append(MLetter(job.id, job.task, list(job.payload), "failed"))
                lettered += 1
        return requeued, lettered

    def release(self, ids: list[int]) -> None:
        """SIGTERM: claimed, unstarted jobs go back as before their claim (the window stays closed)."""
        for pk in ids:
            job = self.jobs[pk]
            assert job.status == RUNNING and not job.started, job
            job.status, job.worker, job.lease_until = READY, "", None
            job.attempts -= 1
            job.started_at = job.started_before

    def prune(self, cutoff: float) -> int:
        """Delete finished jobs that finished before ``cutoff``; dead letters stay."""
        gone = [
            pk
            for pk, job in self.jobs.items()
            if job.status in FINISHED and job.finished_at is not None and job.finished_at < cutoff
        ]
        for pk in gone:
            del self.jobs[pk]
        return len(gone)

    def held_key(self, job: MJob, now: float) -> bool:
        """True if another job of ``job``'s key is RUNNING under a live lease (for the drain)."""
        return any(
            other.id != job.id
            and other.task == job.task
            and other.key == job.key
            and other.status == RUNNING
            and other.lease_until is not None
            and other.lease_until > now
            for other in self.jobs.values()
        )


__all__ = [
    "CANCELLED",
    "EXPIRED",
    "FAILED",
    "FINISHED",
    "READY",
    "RUNNING",
    "SHED",
    "SUCCESSFUL",
    "MJob",
    "MLetter",
    "Model",
    "Spec",
    "ViolationError",
]
