"""The flow-control state rows of gated tasks exist before a claim needs them (issue #17 item 9).

A gated claim locks its tasks' :class:`~django_debounce.models.TaskState` rows
with ``SELECT … FOR UPDATE SKIP LOCKED`` so that a claimer stalled inside its
claim (SIGSTOP, a paused VM, a debugger) never stalls the others (decision 43).
An *insert* cannot skip: a row inserted inside one claim's transaction makes
every other claim that inserts the same name wait for that transaction. So the
rows are inserted before the claim's transaction, each in its own short
autocommit statement (:func:`ensure_task_states`), and the claim only locks.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..conf import settings
from ..flow.rules import Gate
from ..models import TaskState

#: Per database alias: the task names whose row this process has seen or made.
_known: dict[str, frozenset[str]] = {}
_lock = threading.Lock()


def ensure_task_states(gates: Mapping[str, Gate], using: str) -> None:
    """Make sure a :class:`~django_debounce.models.TaskState` row exists for each of ``names``.

    Call it before the claim's transaction. Names this process already knows
    cost nothing (no query); otherwise one query finds the missing rows and one
    ``INSERT … ON CONFLICT DO NOTHING`` (``bulk_create(ignore_conflicts=True)``)
    makes them, committed at once outside a caller's atomic block. A row deleted
    later (a test's flush, a manual delete) is made again by the claim itself
    (:meth:`~django_debounce.flow.admission.Admission.hold`), as before this module.

    A task gated by a rate limit alone needs no row while its tokens are kept in
    Redis (``DEBOUNCE_REDIS``, decision 101); should Redis fail, the claim
    makes the row itself, as for any row missing.

    Args:
        gates: the gated tasks (:func:`~django_debounce.flow.rules.current_gates`).
        using: database alias.

    Raises:
        DatabaseError: the database failed; the claim has not started.
    """
    known = _known.get(using, frozenset())
    redis = settings.redis is not None
    wanted = {
        name
        for name, gate in gates.items()
        if name not in known and (gate.breaker or gate.concurrency is not None or not redis)
    }
    if not wanted:
        return
    existing = set(
        TaskState.objects.using(using)
        .filter(task_name__in=wanted)
        .values_list("task_name", flat=True)
    )
    missing = sorted(wanted - existing)
    if missing:
        TaskState.objects.using(using).bulk_create(
            [TaskState(task_name=name) for name in missing], ignore_conflicts=True
        )
    with _lock:
        _known[using] = _known.get(using, frozenset()) | wanted


def forget() -> None:
    """Forget the names seen, so the next claim checks their rows again.

    For code that deletes :class:`~django_debounce.models.TaskState` rows and wants
    them made again before the next claim (a test that rolls its rows back).
    """
    with _lock:
        _known.clear()


__all__ = ["ensure_task_states", "forget"]
