"""The ``extra`` fields of the package's log records about a job (issue #11 item 4).

Every line that records a job's state change (enqueued, claimed, started,
succeeded, retried, failed, dead-lettered, shed, expired, cancelled) passes
:func:`job_fields` as ``extra``, so a JSON formatter gets the same stable field
names on every line (docs/howto/logging.md; decision 109). A leaf: it reads the
job's attributes and imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol


class _JobLike(Protocol):
    pk: Any
    task_name: str
    queue: str
    attempts: int
    started_at: datetime | None


def job_fields(
    job: _JobLike,
    *,
    action: str,
    outcome: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return the ``extra`` of a log line about ``job``'s state change.

    Args:
        job: the job (a ``Job`` row, as the caller holds it).
        action: the line's ``action`` (kept from before these fields, e.g. ``start_job``).
        outcome: the state change, one word of docs/howto/logging.md (``created``,
            ``debounced``, ``coalesced``, ``claimed``, ``started``, ``succeeded``,
            ``retried``, ``raised``, ``dead_lettered``, ``shed``, ``expired``, ``cancelled``).
        now: with the job's ``started_at``, the run's duration: given for the
            end of a run (success, retry, final failure), ``None`` otherwise.

    Returns:
        ``action``, ``job_id`` (kept for existing filters), ``debounce_job_id``,
        ``debounce_task``, ``debounce_queue``, ``debounce_attempt``,
        ``debounce_outcome`` and ``debounce_duration`` (seconds, float, or
        ``None`` when the line is not about the end of a run).
    """
    duration = None
    if now is not None and job.started_at is not None:
        duration = round((now - job.started_at).total_seconds(), 6)
    return {
        "action": action,
        "job_id": job.pk,
        "debounce_job_id": job.pk,
        "debounce_task": job.task_name,
        "debounce_queue": job.queue,
        "debounce_attempt": job.attempts,
        "debounce_outcome": outcome,
        "debounce_duration": duration,
    }


def jobs_fields(ids: Iterable[int], *, action: str, outcome: str) -> dict[str, Any]:
    """Return the ``extra`` of a line about several jobs ended at once (expired, cancelled).

    Such lines name the jobs by id only (``debounce_job_ids``, a list): the
    bulk write that ended them did not read their task or queue.
    """
    return {"action": action, "debounce_job_ids": list(ids), "debounce_outcome": outcome}


__all__ = ["job_fields", "jobs_fields"]
