"""The records of the state machine's reference model: its task specs, jobs, dead letters, errors.

Pure Python, no Django (see :mod:`.model`); times are seconds after T.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"
EXPIRED, SHED, CANCELLED = "EXPIRED", "SHED", "CANCELLED"
FINISHED = frozenset({SUCCESSFUL, FAILED, EXPIRED, SHED, CANCELLED})


class ViolationError(AssertionError):
    """The package did something the contract does not allow."""

    #: Called with the message of every violation raised (the test notes the first one's step).
    on_raise: ClassVar[Callable[[str], None] | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        if ViolationError.on_raise is not None:
            ViolationError.on_raise(message)


@dataclass(frozen=True)
class Spec:
    """One task of the machine, as the model knows it (mirrors the registration in ``harness``)."""

    name: str
    payload: str = "none"  # "first", "replace", "merge" (debounced), "unique", "none"
    window: float = 10.0
    max_wait: float = 30.0
    rate: tuple[int, float] | None = None  # (capacity, period seconds)
    key_rate: tuple[int, float] | None = None  # rate_limit_per_key (decision 189)
    drop: bool = False  # on_excess="drop", for both buckets
    concurrency: int | None = None
    expires: float | None = None
    priority: int = 0  # claim order only, which the model does not judge
    max_retries: int = 2
    min_backoff: float = 5.0
    max_backoff: float = 20.0
    edge: str = "trailing"  # debounce_edge: "trailing", "leading", "both" (decision 180)

    @property
    def debounced(self) -> bool:
        return self.payload in ("first", "replace", "merge")

    @property
    def gated(self) -> bool:
        return self.rate is not None or self.key_rate is not None or self.concurrency is not None

    def args(self, key: str, call: int) -> list[Any]:
        """Return the JSON form of one call's arguments."""
        if self.payload == "merge":
            return [key, [call]]
        if self.payload == "none":
            return [call]
        return [key, call]

    def backoff(self, attempts: int) -> float:
        """The retry delay after run number ``attempts`` failed (jitter off)."""
        return min(self.max_backoff, self.min_backoff * 2 ** max(0, attempts - 1))


@dataclass
class MJob:
    """The model of one job row."""

    id: int
    task: str
    key: str | None
    payload: list[Any]
    run_at: float
    status: str = READY
    open: bool = False
    opened_at: float | None = None
    max_run_at: float | None = None
    last_call: float | None = None  # ``last_enqueued_at``: an edge burst's last call
    enqueue_count: int = 1
    attempts: int = 0
    max_retries: int = 2
    expires_at: float | None = None
    worker: str = ""
    lease_until: float | None = None
    finished_at: float | None = None
    started_at: float | None = None
    started_before: float | None = None  # ``started_at`` before the current claim
    started: bool = False  # the current claim's run has started (its body may run)
    runs: int = 0  # bodies run to an outcome


@dataclass
class MLetter:
    """The model of one dead letter."""

    job_id: int
    task: str
    args: list[Any]
    kind: str  # "failed", or a shed letter's reason ("shed: rate limit 1/10s exceeded")
    retried: bool = False
