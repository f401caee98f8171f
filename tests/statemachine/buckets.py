"""How the model judges token buckets: the task-wide ``rate_limit`` and ``rate_limit_per_key`` (§6).

Pure Python, like :mod:`.model`. A bucket is addressed by a *scope*: ``(task,
None)`` for the task-wide bucket, ``(task, key)`` for a key's own bucket
(decision 189). Both are judged the same way, each against its own history:

* drop mode (``on_excess="drop"``; the machine's drop buckets hold one token):
  exact. A job is shed only when one of its buckets is empty (a take in the
  last period), and claimed only when all of them hold their token; its dead
  letter names the bucket that shed it;
* defer mode: the starts of one scope in any interval ``[a, b]`` are at most
  ``capacity + capacity × (b − a) / period`` (the exact bucket's float refill
  is not followed), judged when the job starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .records import MJob, Spec

Scope = tuple[str, str | None]


def _text(rate: tuple[int, float]) -> str:
    capacity, period = rate
    return f"{capacity}/{int(period)}s"


@dataclass
class Buckets:
    """The takes and starts the model saw per bucket scope, and the rules judged against them."""

    starts: dict[Scope, list[float]] = field(default_factory=dict)  # defer buckets: starts
    takes: dict[Scope, list[float]] = field(default_factory=dict)  # drop buckets: token takes

    @staticmethod
    def scopes(spec: Spec, job: MJob) -> list[tuple[Scope, tuple[int, float], str]]:
        """Return ``(scope, (capacity, period), shed reason)`` of each bucket ``job`` needs a token of.

        The task-wide bucket first, then the key's (the package judges them in that order). A
        job without a key has no per-key bucket.
        """
        out: list[tuple[Scope, tuple[int, float], str]] = []
        if spec.rate is not None:
            out.append(
                ((spec.name, None), spec.rate, f"shed: rate limit {_text(spec.rate)} exceeded")
            )
        if spec.key_rate is not None and job.key is not None:
            reason = f"shed: rate limit per key {_text(spec.key_rate)} exceeded"
            out.append(((spec.name, job.key), spec.key_rate, reason))
        return out

    def _empty(self, scope: Scope, rate: tuple[int, float], now: float) -> bool:
        """True if the drop bucket of ``scope`` (one token) is empty at ``now``."""
        assert rate[0] == 1, "drop buckets of the machine hold one token"
        return any(now - t < rate[1] for t in self.takes.get(scope, []))

    def shed_reason(self, spec: Spec, job: MJob, now: float, taken_now: set[Scope]) -> str | None:
        """Return the dead letter's reason if shedding ``job`` at ``now`` is allowed, else ``None``.

        ``taken_now``: scopes whose token a job of the same claim took (that claim's
        takes are applied after its sheds are judged).
        """
        if not spec.drop:
            return None
        for scope, rate, reason in self.scopes(spec, job):
            if scope in taken_now or self._empty(scope, rate, now):
                return reason
        return None

    def take(self, spec: Spec, job: MJob, now: float) -> str | None:
        """Record the takes of a claimed drop-mode ``job``; return a violation, or ``None``."""
        if not spec.drop:
            return None
        for scope, rate, _ in self.scopes(spec, job):
            if self._empty(scope, rate, now):
                which = "its key's bucket" if scope[1] is not None else "its bucket"
                return f"{which} had no token"
        for scope, _, _ in self.scopes(spec, job):
            self.takes.setdefault(scope, []).append(now)
        return None

    def start(self, spec: Spec, job: MJob, now: float) -> str | None:
        """Record a defer-mode start of ``job`` at ``now``; return a violated rate bound, or ``None``."""
        if spec.drop:
            return None
        for scope, (capacity, period), _ in self.scopes(spec, job):
            starts = self.starts.setdefault(scope, [])
            starts.append(now)
            for first in starts:
                count = sum(1 for t in starts if first <= t <= now)
                if count > capacity + capacity * (now - first) / period + 1e-9:
                    where = job.task if scope[1] is None else f"{job.task}[{scope[1]}]"
                    return f"{where}: {count} starts in [{first}, {now}], rate {capacity}/{period}s"
        return None

    def may_wait(self, spec: Spec, job: MJob, now: float) -> bool:
        """True if a defer-mode bucket of ``job`` may be short of a token at ``now`` (for the drain).

        Weaker than the exact bucket: some start of the scope in the last period.
        """
        if spec.drop:
            return False
        return any(
            any(now - period < t <= now for t in self.starts.get(scope, []))
            for scope, (_, period), _ in self.scopes(spec, job)
        )


__all__ = ["Buckets", "Scope"]
