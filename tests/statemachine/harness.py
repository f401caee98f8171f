"""The machine's side of the package: its tasks, logical workers, and the database as read back.

The tasks are registered for the length of one test (:func:`registered_tasks`)
and mirror :data:`SPECS`, the model's view of them. A task's body records the
run (job id, attempt, the arguments it received) in :data:`RUNS` and fails
when :data:`FAIL` holds its job id. A :class:`LogicalWorker` wraps a real
:class:`~django_debounce.worker.loop.Worker` whose claim (``Worker._claim``, with its
``start_now``) and hand-over (``Worker._may_start``) the machine calls one step
at a time, keeping the claimed-but-unstarted jobs as the worker would.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django_debounce import registry, task
from django_debounce.context import JobContext
from django_debounce.models import DeadLetter, Job
from django_debounce.worker.loop import Worker
from tests.conftest import T

from .model import Spec

LEASE = dt.timedelta(seconds=60)

SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec("sm.first", payload="first"),
        Spec("sm.replace", payload="replace"),
        Spec("sm.merge", payload="merge"),
        Spec("sm.unique", payload="unique"),
        Spec("sm.rated", rate=(2, 10.0)),
        Spec("sm.dropped", rate=(1, 10.0), drop=True),
        Spec("sm.capped", concurrency=1),
        Spec("sm.expiring", expires=6.0, priority=10),
        Spec("sm.leading", payload="first", edge="leading"),
        Spec("sm.both", payload="replace", edge="both"),
        Spec("sm.keyrated", payload="first", window=2.0, max_wait=6.0, key_rate=(2, 60.0)),
        Spec(
            "sm.keydropped",
            payload="replace",
            window=2.0,
            max_wait=6.0,
            key_rate=(1, 30.0),
            drop=True,
        ),
    )
}

#: ``(job id, attempt, args as received)`` per body run, in order.
RUNS: list[tuple[int, int, list[Any]]] = []
#: Job ids whose next run raises.
FAIL: set[int] = set()
#: Job ids whose next run returns what JSON cannot hold (a dict with a tuple key, decision 149).
ODD: set[int] = set()


class PlannedError(RuntimeError):
    """The failure the machine asked a run for."""


def _body(ctx: JobContext, *args: Any) -> str:
    assert ctx.job is not None
    RUNS.append((ctx.job.pk, ctx.attempt, _json(list(args))))
    if ctx.job.pk in FAIL:
        FAIL.discard(ctx.job.pk)
        raise PlannedError(f"planned failure of job {ctx.job.pk}")
    if ctx.job.pk in ODD:
        ODD.discard(ctx.job.pk)
        return {(1, 2): "pair"}  # type: ignore[return-value]
    return "ok"


def _json(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_json(item) for item in value]
    return value


def _union(stored: Any, new: Any) -> Any:
    (key, ids), _ = stored
    (_, more), _ = new
    return [key, list(ids) + [i for i in more if i not in ids]], {}


def _options(spec: Spec) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": spec.name,
        "takes_context": True,
        "max_retries": spec.max_retries,
        "min_backoff": spec.min_backoff,
        "max_backoff": spec.max_backoff,
    }
    if spec.debounced:
        options.update(debounce=spec.window, debounce_max_wait=spec.max_wait)
        options["debounce_key"] = "{0}"
        if spec.payload == "replace":
            options["debounce_replace_payload"] = True
        if spec.payload == "merge":
            options["debounce_merge"] = _union
        if spec.edge != "trailing":
            options["debounce_edge"] = spec.edge
    if spec.payload == "unique":
        options["unique_key"] = "u:{0}"
    if spec.rate is not None:
        capacity, period = spec.rate
        options["rate_limit"] = f"{capacity}/{int(period)}s"
        options["on_excess"] = "drop" if spec.drop else "defer"
    if spec.key_rate is not None:
        capacity, period = spec.key_rate
        options["rate_limit_per_key"] = f"{capacity}/{int(period)}s"
        options["on_excess"] = "drop" if spec.drop else "defer"
    if spec.concurrency is not None:
        options["concurrency"] = spec.concurrency
    if spec.expires is not None:
        options["expires"] = spec.expires
    if spec.priority:
        options["priority"] = spec.priority
    return options


@contextmanager
def registered_tasks() -> Iterator[dict[str, Any]]:
    """Register the machine's tasks (one function each); unregister them afterwards."""
    tasks = {}
    try:
        for spec in SPECS.values():
            if spec.payload == "none":

                def body(ctx: JobContext, value: Any) -> str:
                    return _body(ctx, value)

            else:

                def body(ctx: JobContext, key: str, value: Any) -> str:  # type: ignore[misc]
                    return _body(ctx, key, value)

            body.__qualname__ = body.__name__ = spec.name.replace(".", "_")
            tasks[spec.name] = task(**_options(spec))(body)
        yield tasks
    finally:
        for name in SPECS:
            registry.unregister(name)


def seconds(value: dt.datetime | None) -> float | None:
    """Return ``value`` as seconds after T (the model's time)."""
    return None if value is None else (value - T).total_seconds()


@dataclass
class LogicalWorker:
    """One worker process of the machine: a real ``Worker`` driven step by step."""

    name: str
    concurrency: int
    batched: bool = False  # successes wait in the worker's SuccessBatch (decision 120)
    generation: int = 0
    worker: Worker = field(init=False)
    running: list[Job] = field(default_factory=list)  # handed to a thread, outcome pending
    waiting: list[Job] = field(default_factory=list)  # claimed ahead, not started

    def __post_init__(self) -> None:
        self.restart()

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id

    def restart(self) -> None:
        """A new process: a fresh ``Worker`` with a new id, nothing held."""
        self.generation += 1
        self.worker = Worker(
            worker_id=f"{self.name}-{self.generation}",
            concurrency=self.concurrency,
            lease=LEASE,
            prefetch=4,
            handle_signals=False,
            success_flush_interval=60 if self.batched else 0,
        )
        self.running, self.waiting = [], []

    def held(self) -> list[Job]:
        return self.running + self.waiting

    def claim(self, limit: int) -> tuple[list[Job], int]:
        """Claim through ``Worker._claim``; return the jobs and the ``start_now`` it passed."""
        self.worker._in_flight = {job.pk: job for job in self.held()}
        start_now = max(0, self.concurrency - len(self.held()))
        jobs = self.worker._claim(limit)
        self.waiting.extend(jobs)
        return jobs, start_now


def db_jobs() -> dict[int, dict[str, Any]]:
    """Every job row, as the fields the model predicts."""
    rows = {}
    for job in Job.objects.order_by("pk"):
        rows[job.pk] = {
            "task": job.task_name,
            "status": str(job.status),
            "payload": job.args,
            "run_at": seconds(job.run_at),
            "open": job.window_key is not None,
            "count": job.enqueue_count,
            "last_call": seconds(job.last_enqueued_at),
            "opened_at": seconds(job.opened_at),
            "ceiling": seconds(job.max_run_at),
            "attempts": job.attempts,
            "expires_at": seconds(job.expires_at),
            "worker": job.worker_id,
            "key": job.debounce_key,
            "started_at": seconds(job.started_at),
            "finished_at": seconds(job.finished_at),
            "lease_until": seconds(job.lease_expires_at),
        }
    return rows


def db_letters() -> list[tuple[int | None, str, list[Any], bool, str]]:
    """Every dead letter as ``(job id, task, args, retried, reason)``, oldest first."""
    return [
        (letter.job_id, letter.task_name, letter.args, letter.retried_at is not None, letter.reason)
        for letter in DeadLetter.objects.order_by("pk")
    ]


class Env:
    """What the machine needs from the test: the clock mover and the registered tasks."""

    clock: Callable[..., dt.datetime]
    tasks: dict[str, Any]
    steps = 0
    examples = 0
    #: What happened, summed over the run (printed at the end: the machine did reach these).
    seen: Counter[str] = Counter()
    #: ``(example, step, message)`` of the first violation (before Hypothesis shrinks it).
    first: tuple[int, int, str] | None = None

    @classmethod
    def note_violation(cls, message: str) -> None:
        if cls.first is None:
            cls.first = (cls.examples, cls.steps, message)
            # Straight to the terminal: shrinking may outlast the test's timeout.
            print(
                f"\nfirst violation: example {cls.examples}, step {cls.steps}: {message}",
                file=sys.__stderr__,
                flush=True,
            )
