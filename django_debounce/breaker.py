"""Circuit breakers (contract §6, §11): ``circuit_breaker=CircuitBreaker(failures=5, reset="1m")``.

States, kept per task name in :class:`~django_debounce.models.TaskState`
(``breaker_state``, ``failures``, ``opened_at``, ``probe_job_id``) so every
worker of the deployment sees one breaker:

* **closed**: jobs run. Every run that raises counts as a failure (also one
  that will be retried); a successful run resets the count to 0. At
  ``failures`` consecutive failures the breaker opens, ``opened_at = now``.
* **open**: the task's due jobs are deferred (they stay READY and keep
  ``run_at``; never dropped, never failed). Once ``reset`` has passed since
  ``opened_at`` the next claim admits one job as the probe and the breaker
  turns half-open.
* **half-open**: no other job runs while the probe runs. The probe's success
  closes the breaker (count 0); its failure reopens it (``opened_at = now``,
  so ``reset`` counts again). A probe whose worker died (its lease lapsed) or
  that was shed before it ran no longer blocks: the next claim admits a new probe.

The transition functions here are pure (they change a ``TaskState`` in memory
and say whether it changed); :mod:`django_debounce.flow.admission` and the worker
save the row under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .conf.durations import DurationLike, parse_duration
from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from .models import TaskState

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True, init=False)
class CircuitBreaker:
    """A task's circuit breaker: open after ``failures`` consecutive failed runs, probe after ``reset``.

    Args:
        failures: consecutive failed runs that open the breaker; an int ≥ 1
            (default 5).
        reset: how long the breaker stays open before one probe runs, counted
            from the moment it opened: seconds (``int``/``float``), a
            ``timedelta`` or a string such as ``"30s"``, ``"1m"`` (default
            one minute). Stored as a ``timedelta``.

    Raises:
        ConfigurationError: ``failures`` is not an int ≥ 1, or ``reset`` is not
            a positive duration (raised when the breaker is built, i.e. at
            registration).
    """

    failures: int
    reset: timedelta

    def __init__(self, failures: int = 5, reset: DurationLike = "1m") -> None:
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
            raise ConfigurationError(
                f"CircuitBreaker(failures={failures!r}): give the number of consecutive failed "
                "runs that opens the breaker, an int >= 1 (e.g. failures=5)."
            )
        object.__setattr__(self, "failures", failures)
        object.__setattr__(self, "reset", parse_duration(reset, name="CircuitBreaker(reset)"))

    def probe_due_at(self, state: TaskState) -> datetime | None:
        """Return when the open breaker of ``state`` admits its probe: ``opened_at + reset``.

        The one statement of the probe rule: from that instant on the next
        claim admits one job as the probe (:func:`~django_debounce.flow.rules.verdict`),
        and the admin and ``debounce_status`` show it as "open until"
        (:func:`~django_debounce.flow.hold_reasons.flow_view`). ``None`` unless the
        breaker is open with an opening time stored (closed, half-open, or an
        open row without ``opened_at``, which holds until a failure reopens it).
        """
        if state.breaker_state != OPEN or state.opened_at is None:
            return None
        return state.opened_at + self.reset

    def record_success(self, state: TaskState, job_id: int) -> bool:
        """Apply a successful run of job ``job_id`` to ``state``; return True if it changed.

        A success resets the failure count. The probe's success closes a
        half-open breaker. A success while open (a run that started before the
        breaker opened) resets the count but leaves the breaker open: only a
        probe closes it.
        """
        before = (state.breaker_state, state.failures, state.opened_at, state.probe_job_id)
        state.failures = 0
        if state.breaker_state == HALF_OPEN and state.probe_job_id == job_id:
            state.breaker_state = CLOSED
            state.opened_at = None
            state.probe_job_id = None
        return before != (state.breaker_state, state.failures, state.opened_at, state.probe_job_id)

    def record_failure(self, state: TaskState, job_id: int, now: datetime) -> bool:
        """Apply a failed run (it raised) of job ``job_id`` at ``now``; return True (it changed).

        The count goes up by one. Closed: at the threshold the breaker opens
        with ``opened_at = now``. Half-open: the probe's failure reopens it
        (``opened_at = now``). Open: it stays open, ``opened_at`` unchanged (a
        run that started before it opened does not extend the wait).
        """
        state.failures += 1
        if state.breaker_state == CLOSED and state.failures >= self.failures:
            state.breaker_state = OPEN
            state.opened_at = now
            state.probe_job_id = None
        elif state.breaker_state == HALF_OPEN and state.probe_job_id == job_id:
            state.breaker_state = OPEN
            state.opened_at = now
            state.probe_job_id = None
        return True
