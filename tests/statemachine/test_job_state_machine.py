"""A model-checked state machine of jobs, windows, claims and runs (issue #18 item 1).

Hypothesis interleaves enqueues (single, bulk, rolled back), clock moves,
claims by logical workers claiming ahead (``Worker._claim``'s ``start_now``),
hand-overs (``Worker._may_start``), successes, failures, worker deaths (lease
lapse and ``reclaim_expired_leases``), SIGTERM releases, dead-letter retries,
prunes, drains and, on PostgreSQL and MariaDB, a claim that an enqueue races
between its unlocked read and its lock. After every step the database must
equal the reference model (``model.py``, ``invariants.compare``); each claim
and start is judged by the model's rules. Budget: ``DEBOUNCE_SM_EXAMPLES``
examples of ``DEBOUNCE_SM_STEPS`` steps; ``DEBOUNCE_SM_SEED`` replays a run
(every run prints its seed). See README.md.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_debounce.claim import gated as gated_claim
from django_debounce.enqueueing.bulk import enqueue_many
from django_debounce.models import DeadLetter, Job, KeyBucket, QueueState, TaskState
from django_debounce.ops import retention
from django_debounce.run import leases
from django_debounce.run.execution import run_job
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis

from .harness import (
    FAIL,
    LEASE,
    ODD,
    RUNS,
    SPECS,
    Env,
    LogicalWorker,
    db_jobs,
    db_letters,
    registered_tasks,
)
from .invariants import check_drained, compare
from .model import FINISHED, READY, Model, ViolationError

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("DEBOUNCE_SM_EXAMPLES", "50"))
STEPS = int(os.environ.get("DEBOUNCE_SM_STEPS", "60"))
#: ``DEBOUNCE_SM_REDIS=1``: the rate-limit buckets (task-wide and per key) in Redis.
REDIS = os.environ.get("DEBOUNCE_SM_REDIS") == "1"
NAMES = sorted(SPECS)
#: The tasks limited per key: a rule of their own calls them often enough for keys to run out.
KEYED = sorted(name for name, spec in SPECS.items() if spec.key_rate is not None)
KEYS = ["k1", "k2", "k3"]
#: Clock moves: small ones inside a window, large ones past windows, ceilings and expiries.
STEP_SIZES = [0.5, 1.0, 3.0, 7.0, 12.0, 31.0, 45.0]
#: The racing enqueue lands on windows of these tasks (a payload the claim must see).
RACED = ("sm.merge", "sm.replace")
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink, Phase.explain)


class _RollbackError(Exception):
    """Raised inside ``transaction.atomic()`` to roll the calls back."""


class JobMachine(RuleBasedStateMachine):
    """The package driven by Hypothesis, checked against :class:`~.model.Model` after each step."""

    @initialize()
    def start(self) -> None:
        for model in (Job, DeadLetter, TaskState, QueueState, KeyBucket):
            model.objects.all().delete()
        if REDIS:  # the buckets of the last example
            delete_test_keys(cache_url(), key_prefix())
        RUNS.clear()
        FAIL.clear()
        ODD.clear()
        self.now = 0.0
        Env.clock(seconds=0)
        Env.examples += 1
        self.model = Model(dict(SPECS), lease=LEASE.total_seconds())
        self.workers = [LogicalWorker("a", 1), LogicalWorker("b", 2)]
        self.drainer = LogicalWorker("drain", 8, batched=True)
        self.calls = 0
        #: Runs of killed workers, still going in a process cut off from the database (a
        #: partition, not a kill): their late outcomes must be discarded (§11).
        self.zombies: list[tuple[str, Job]] = []

    # -- helpers -----------------------------------------------------------------------------
    def _call(self, task: str, key: str) -> list[Any]:
        self.calls += 1
        return SPECS[task].args(key, self.calls)

    def _apply(self, task: str, key: str, args: list[Any], job: Job) -> None:
        self.model.apply_enqueue(task, key, args, self.now, job.outcome, job.pk)
        edge = SPECS[task].edge
        if edge != "trailing":  # what the machine reached: leading runs, swallowed calls, …
            Env.seen[f"{edge}_{job.outcome}_{job.status.lower()}"] += 1

    def _advance(self, total: float) -> None:
        """Move the clock as live workers see it: leases renewed every 20 s, lapsed ones reclaimed."""
        while total > 0:
            step = min(total, 20.0)
            for w in self.workers:
                ids = [job.pk for job in w.held()]
                if ids:
                    renewed = leases.renew_leases(
                        ids, worker_id=w.worker_id, lease=LEASE, using="default"
                    )
                    assert renewed == len(ids), (w.worker_id, ids, renewed)
                    self.model.renew(ids, self.now)
            self.now += step
            total -= step
            Env.clock(seconds=self.now)
            got = leases.reclaim_expired_leases(using="default")
            want = self.model.reclaim(self.now)
            if got != want:
                raise ViolationError(f"reclaim at {self.now}: db {got}, model {want}")
            Env.seen.update(requeued_after_lapse=got[0], dead_lettered_after_lapse=got[1])

    def _claim(self, w: LogicalWorker, limit: int) -> list[Job]:
        ready = [pk for pk, job in self.model.jobs.items() if job.status == READY]
        jobs, start_now = w.claim(limit)
        after = dict(Job.objects.filter(pk__in=ready).values_list("pk", "status"))
        expired = [pk for pk in ready if after.get(pk) == Job.Status.EXPIRED]
        shed = [pk for pk in ready if after.get(pk) == Job.Status.SHED]
        self.model.check_claim(
            w.worker_id, [job.pk for job in jobs], expired, shed, self.now, start_now
        )
        Env.seen.update(claimed=len(jobs), expired_at_claim=len(expired), shed=len(shed))
        Env.seen.update(f"shed_{self.model.jobs[pk].task}" for pk in shed)
        Env.seen.update(
            key_rated_claimed=sum(1 for job in jobs if SPECS[job.task_name].key_rate is not None)
        )
        Env.seen.update(claimed_ahead=max(0, len(jobs) - start_now))
        for job in jobs:  # what the claim returned is what runs (§4.5, decision 146)
            want = self.model.jobs[job.pk].payload
            if job.args != want:
                raise ViolationError(
                    f"claim at {self.now} returned #{job.pk} with {job.args}, not {want}"
                )
        self._pump(w)
        return jobs

    def _pump(self, w: LogicalWorker) -> None:
        """Free threads take the next claimed jobs at once, as the worker's threads do."""
        while len(w.running) < w.concurrency and w.waiting:
            job = w.waiting.pop(0)
            started = w.worker._may_start(job)
            self.model.hand_over(job.pk, w.worker_id, self.now, started)
            Env.seen["started" if started else "expired_at_start"] += 1
            if started:
                w.running.append(job)

    def _finish(self, w: LogicalWorker, index: int, ok: bool, odd: bool = False) -> None:
        job = w.running.pop(index % len(w.running))
        if not ok:
            FAIL.add(job.pk)
        elif odd:  # an odd result is a success like any other, stored as its repr
            ODD.add(job.pk)
        batch = w.worker._successes if w.batched else None
        run_job(job, worker_id=w.worker_id, using="default", retry_for=LEASE, successes=batch)
        mjob = self.model.jobs[job.pk]
        ran = RUNS[-1]
        if ran != (job.pk, mjob.attempts, mjob.payload):
            raise ViolationError(
                f"run at {self.now}: {ran}, model says {(job.pk, mjob.attempts, mjob.payload)}"
            )
        self.model.finish(job.pk, ok, self.now)
        Env.seen["succeeded" if ok else "failed"] += 1
        if not w.batched:
            self._pump(w)

    # -- rules -------------------------------------------------------------------------------
    @rule(task=st.sampled_from(NAMES), key=st.sampled_from(KEYS))
    def enqueue(self, task: str, key: str) -> None:
        args = self._call(task, key)
        self._apply(task, key, args, Env.tasks[task].apply_async(args=args))

    @rule(
        task=st.sampled_from(KEYED),
        calls=st.lists(
            st.tuples(st.sampled_from(KEYS[:2]), st.sampled_from(STEP_SIZES[:4])),
            min_size=1,
            max_size=4,
        ),
    )
    def key_burst(self, task: str, calls: list[tuple[str, float]]) -> None:
        """Calls of a task limited per key (decision 189), each followed by a wait, a claim by
        worker ``b`` and its runs' ends: a key soon runs out of tokens while the other has some."""
        w = self.workers[1]
        for key, wait in calls:
            self.enqueue(task, key)
            self._advance(wait)
            self._claim(w, 2)
            while w.running:
                self._finish(w, 0, True)

    @rule(
        calls=st.lists(
            st.tuples(st.sampled_from(NAMES), st.sampled_from(KEYS)), min_size=2, max_size=4
        )
    )
    def enqueue_bulk(self, calls: list[tuple[str, str]]) -> None:
        made = [(task, key, self._call(task, key)) for task, key in calls]
        jobs = enqueue_many([(Env.tasks[task], args) for task, _, args in made])
        for (task, key, args), job in zip(made, jobs, strict=True):
            self._apply(task, key, args, job)

    @rule(
        calls=st.lists(
            st.tuples(st.sampled_from(NAMES), st.sampled_from(KEYS)), min_size=1, max_size=3
        ),
        bulk=st.booleans(),
    )
    def enqueue_rolled_back(self, calls: list[tuple[str, str]], bulk: bool) -> None:
        made = [(task, self._call(task, key)) for task, key in calls]
        try:
            with transaction.atomic():
                if bulk:
                    enqueue_many([(Env.tasks[task], args) for task, args in made])
                else:
                    for task, args in made:
                        Env.tasks[task].apply_async(args=args)
                raise _RollbackError
        except _RollbackError:
            pass  # no trace: the next compare checks every row

    @rule(step=st.sampled_from(STEP_SIZES))
    def advance(self, step: float) -> None:
        self._advance(step)

    @rule(which=st.integers(0, 1), limit=st.integers(1, 4))
    def claim(self, which: int, limit: int) -> None:
        self._claim(self.workers[which], limit)

    @precondition(lambda self: any(len(w.running) == w.concurrency for w in self.workers))
    @rule(which=st.integers(0, 1), limit=st.integers(1, 4), wait=st.sampled_from(STEP_SIZES))
    def claim_ahead_of_a_slow_run(self, which: int, limit: int, wait: float) -> None:
        """A busy worker claims ahead, its running job takes ``wait`` seconds, a thread frees up."""
        busy = [w for w in self.workers if len(w.running) == w.concurrency]
        w = busy[which % len(busy)]
        self._claim(w, limit)
        self._advance(wait)
        self._finish(w, 0, True)

    @precondition(lambda self: any(w.running for w in self.workers))
    @rule(which=st.integers(0, 1), index=st.integers(0, 3), ok=st.booleans(), odd=st.booleans())
    def finish(self, which: int, index: int, ok: bool, odd: bool) -> None:
        w = self.workers[which]
        if w.running:
            self._finish(w, index, ok, odd)

    @precondition(lambda self: any(w.held() for w in self.workers))
    @rule(which=st.integers(0, 1))
    def kill_worker(self, which: int) -> None:
        """SIGKILL: its runs stop; after the lease the jobs are reclaimed (at-least-once)."""
        w = self.workers[which]
        self.model.kill(w.worker_id)
        self.zombies.extend((w.worker_id, job) for job in w.running)
        w.restart()
        self._advance(LEASE.total_seconds() + 1)

    @precondition(lambda self: bool(self.zombies))
    @rule(index=st.integers(0, 3), ok=st.booleans())
    def late_finish(self, index: int, ok: bool) -> None:
        """A run whose lease lapsed ends late: its outcome is discarded (the lease is a fence)."""
        worker_id, job = self.zombies.pop(index % len(self.zombies))
        if not ok:
            FAIL.add(job.pk)
        run_job(job, worker_id=worker_id, using="default", retry_for=LEASE, successes=None)
        FAIL.discard(job.pk)
        Env.seen["late_finish"] += 1

    @precondition(lambda self: any(w.waiting for w in self.workers))
    @rule(which=st.integers(0, 1))
    def sigterm(self, which: int) -> None:
        """SIGTERM: the claimed-but-unstarted jobs go back (``release_unstarted``)."""
        w = self.workers[which]
        if w.waiting:
            w.worker._release(w.waiting)
            self.model.release([job.pk for job in w.waiting])
            w.waiting = []

    @precondition(lambda self: bool(self.model.letters))
    @rule(index=st.integers(0, 50), force=st.booleans())
    def retry_dead_letter(self, index: int, force: bool) -> None:
        letter = self.model.letters[index % len(self.model.letters)]
        job_id = letter.job_id if letter.job_id in self.model.jobs else None
        row = (
            DeadLetter.objects.filter(job_id=job_id, task_name=letter.task, args=letter.args)
            .filter(retried_at__isnull=not letter.retried)
            .order_by("pk")
            .first()
        )
        if row is None:
            raise ViolationError(f"no dead letter in the database for {letter}")
        job = row.retry(force=force)
        if letter.retried and not force:
            if job is not None:
                raise ViolationError(f"retrying {letter} again without force went to #{job.pk}")
            return
        if job is None:
            raise ViolationError(f"retrying {letter} did nothing")
        spec = SPECS[letter.task]
        key = letter.args[0] if spec.payload != "none" else "-"
        self.model.apply_enqueue(letter.task, key, list(letter.args), self.now, job.outcome, job.pk)
        Env.seen["dead_letter_retried"] += 1
        letter.retried = True

    @rule()
    def prune(self) -> None:
        result = retention.prune_jobs(older_than=dt.timedelta(seconds=30))
        want = self.model.prune(self.now - 30)
        if result.jobs != want:
            raise ViolationError(f"prune at {self.now} deleted {result.jobs}, model {want}")

    @rule()
    def drain(self) -> None:
        """A worker with 8 free threads runs everything due now; then nothing due may be left."""
        for _ in range(50):
            w = self.drainer
            before = {pk: job.status for pk, job in self.model.jobs.items()}
            jobs = self._claim(w, 8)
            while w.running:
                self._finish(w, 0, True)
            pending = len(w.worker._successes)
            written = w.worker._successes.flush()  # one UPDATE for the round's successes
            if written != pending:
                raise ViolationError(
                    f"drain at {self.now}: {written} of {pending} successes written"
                )
            Env.seen["batched_successes"] += written
            changed = any(
                self.model.jobs[pk].status != s for pk, s in before.items() if pk in self.model.jobs
            )
            if not jobs and not changed:
                break
        check_drained(self.model, self.now)
        Env.seen["left_waiting_for_a_key_token"] += sum(
            1
            for job in self.model.jobs.values()
            if job.status == READY and job.run_at <= self.now and SPECS[job.task].key_rate
        )

    @precondition(
        lambda self: connection.vendor in ("postgresql", "mysql") and bool(self._raceable())
    )
    @rule(which=st.integers(0, 1), limit=st.integers(1, 4), pick=st.integers(0, 5))
    def claim_raced_by_enqueue(self, which: int, limit: int, pick: int) -> None:
        """An enqueue joins a due window between the gated claim's unlocked read and its lock."""
        targets = self._raceable()
        target = targets[pick % len(targets)]
        real = gated_claim.lock_due
        raced: list[Job] = []
        args = self._call(target.task, target.key or "")

        def enqueue_elsewhere() -> None:
            try:
                raced.append(Env.tasks[target.task].apply_async(args=args))
            finally:
                connections.close_all()

        def lock_due(shape: Any, ids: list[int], now: Any, using: str) -> Any:
            if target.id in ids and not raced:
                thread = threading.Thread(target=enqueue_elsewhere)
                thread.start()
                thread.join(30)
                assert raced, "the racing enqueue did not finish"
                self._apply(target.task, target.key or "", args, raced[0])
                Env.seen["raced_enqueue"] += 1
            return real(shape, ids, now, using)

        gated_claim.lock_due = lock_due
        try:
            self._claim(self.workers[which], limit)
        finally:
            gated_claim.lock_due = real

    def _raceable(self) -> list[Any]:
        return [
            job
            for job in self.model.jobs.values()
            if job.task in RACED
            and job.open
            and job.max_run_at is not None
            and job.max_run_at <= self.now
        ]

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def database_is_the_model(self) -> None:
        Env.steps += 1
        compare(self.model, db_jobs(), db_letters(), self.now)

    @invariant()
    def finished_jobs_hold_no_worker(self) -> None:
        for w in [*self.workers, self.drainer]:
            for job in w.held():
                if self.model.jobs[job.pk].status in FINISHED:
                    raise ViolationError(f"#{job.pk} finished but {w.worker_id} still holds it")


def test_job_state_machine(clock: Callable[..., dt.datetime], settings: Any) -> None:
    """Run the machine under the CI budget (or ``DEBOUNCE_SM_*``); print the seed to replay it."""
    settings.DEBOUNCE_BACKOFF_JITTER = False
    if REDIS:
        require_redis()
        settings.DEBOUNCE_REDIS = "redis"
    seed = int(os.environ.get("DEBOUNCE_SM_SEED") or random.randrange(2**32))
    Env.clock, Env.steps, Env.examples, Env.seen, Env.first = clock, 0, 0, Counter(), None
    ViolationError.on_raise = Env.note_violation
    budget = hypothesis.settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # DEBOUNCE_SM_SHRINK=0: report the first failure as found (shrinking replays for minutes).
        phases=PHASES if os.environ.get("DEBOUNCE_SM_SHRINK", "1") != "0" else PHASES[:-2],
    )
    with registered_tasks() as tasks:
        Env.tasks = tasks
        try:
            run_state_machine_as_test(hypothesis.seed(seed)(JobMachine), settings=budget)
        finally:
            print(
                f"job state machine on {connection.vendor}{' with Redis' if REDIS else ''}: "
                f"{Env.examples} example(s), "
                f"{Env.steps} step(s); replay with DEBOUNCE_SM_SEED={seed}; "
                f"seen: {dict(sorted(Env.seen.items()))}"
            )
            if Env.first is not None:
                example, step, message = Env.first
                print(f"first violation: example {example}, step {step}: {message}")
            ViolationError.on_raise = None
