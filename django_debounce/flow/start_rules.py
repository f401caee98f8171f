"""The rules judged at the moment a job starts, and which claimed jobs may wait for a thread.

A claim may take more jobs than an executor can start at once: the built-in
worker claims ahead (its prefetch, decision 121) so that one claim serves many
jobs. A claimed job is closed to new calls (§4.1) and is never changed (§4.5),
but the rules of §6 speak of the moment a job *starts*, not of the moment it
was claimed. This module is the one place that says which rule is judged
when (decision 146 in docs/decisions.md):

* **the payload** is what the job's locked row holds: a gated claim reads its
  candidates before it locks them, and runs the rows it locked
  (:func:`~django_debounce.claim.queries.lock_due`);
* **expiry** depends on the job and the clock alone, so it is judged again
  when the job is handed to a thread (:func:`expired_at_start`): a claimed job
  past its expiry by then ends EXPIRED unrun, as if it had never been claimed;
* **rate limits, concurrency caps, circuit breakers and CoDel** depend on
  state shared by every worker (a bucket, a count, a queue's sojourn), which
  only the claim's transaction can judge. A job under one of them is
  therefore never claimed ahead: the claim takes it only for a thread that
  starts it at once (:func:`judged_at_start`, :func:`cut_for_start`), so its
  token, slot, probe and sojourn are taken at the moment it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime

from ..models import Job

#: ``judged(job) -> bool``: True when ``job`` has a rule only its claim can judge.
JudgedAtStart = Callable[[Job], bool]


def judged_at_start(gates: Collection[str], codel_queues: Collection[str]) -> JudgedAtStart:
    """Return the test of a job whose start the claim itself must judge (§6).

    Args:
        gates: the names of the tasks with a rate limit, a concurrency cap or a
            circuit breaker (:func:`~django_debounce.flow.rules.current_gates`).
        codel_queues: the queues with CoDel in ``DEBOUNCE_QUEUES``.

    Returns:
        A function of a :class:`~django_debounce.models.Job` that is True when the
        job's task is gated or its queue has CoDel: such a job is never claimed
        ahead of a free thread (:func:`cut_for_start`).
    """
    if not gates and not codel_queues:
        return _never
    names, queues = frozenset(gates), frozenset(codel_queues)
    return lambda job: job.task_name in names or job.queue in queues


def _never(job: Job) -> bool:
    return False


def cut_for_start(jobs: Sequence[Job], start_now: int | None, judged: JudgedAtStart) -> list[Job]:
    """Return the claimed ``jobs`` that may be taken when only ``start_now`` of them start at once.

    ``jobs`` are in claim order; the first ``start_now`` start at once, the rest
    wait for a thread. A job the claim must judge at its start (``judged``) is
    kept only among the first ``start_now``; the claim ends before the first
    one past them, so that no job claimed ahead passes it in line (it is taken
    by the next claim that has a free thread for it).

    Args:
        jobs: the claim's jobs, in claim order.
        start_now: how many of them the caller starts at once; ``None``: all.
        judged: :func:`judged_at_start` of this claim.
    """
    if start_now is None or len(jobs) <= start_now:
        return list(jobs)
    for index in range(start_now, len(jobs)):
        if judged(jobs[index]):
            return list(jobs[:index])
    return list(jobs)


def expired_at_start(job: Job, now: datetime) -> bool:
    """Return True when the claimed ``job`` is past its expiry at ``now``, the moment it would start.

    ``expires="1h"`` (§6): a job not started by then never runs. The claim expires
    the due jobs it finds past their expiry; this is the same rule for a job
    claimed ahead that waited for a thread (decision 146).
    """
    return job.expires_at is not None and job.expires_at <= now


__all__ = ["JudgedAtStart", "cut_for_start", "expired_at_start", "judged_at_start"]
