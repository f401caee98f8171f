"""What the machine checks after every step: the database equals the model, and liveness at a drain.

:func:`compare` is exact: every job row's task, status, payload, deadline,
window state, opening and ceiling, call count, last call, attempts, expiry and
worker are the model's, no row is missing or extra (so a call inside a
rolled-back transaction left no trace), at most one window is open per (task, key), and the dead letters are
the model's (task, arguments, kind, retried or not). :func:`check_drained`
is the liveness half: after a drain nothing due is left that a claim had to
take.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .model import READY, RUNNING, MLetter, Model, ViolationError


def compare(
    model: Model, rows: dict[int, dict[str, Any]], letters: list[tuple], now: float
) -> None:
    """Raise :class:`ViolationError` unless the database ``rows``/``letters`` are the model's."""
    if set(rows) != set(model.jobs):
        extra = sorted(set(rows) - set(model.jobs))
        missing = sorted(set(model.jobs) - set(rows))
        raise ViolationError(
            f"at {now}: jobs in the database only {extra}, in the model only {missing}"
        )
    opened = Counter((row["task"], row["key"]) for row in rows.values() if row["open"])
    doubled = [key for key, count in opened.items() if count > 1]
    if doubled:
        raise ViolationError(f"at {now}: more than one open window for {doubled}")
    for pk, row in rows.items():
        job = model.jobs[pk]
        spec = model.specs[job.task]
        expected = {
            "task": job.task,
            "status": job.status,
            "payload": job.payload,
            "run_at": job.run_at,
            "open": job.open,
            "count": job.enqueue_count if spec.debounced else row["count"],
            "last_call": job.last_call if spec.debounced else row["last_call"],
            "opened_at": job.opened_at,
            "ceiling": job.max_run_at,
            "attempts": job.attempts,
            "expires_at": job.expires_at,
            "worker": job.worker if job.status == RUNNING else row["worker"],
            "key": job.key if spec.debounced else row["key"],
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "lease_until": job.lease_until,
        }
        if row != expected:
            diff = {k: (row[k], expected[k]) for k in row if row[k] != expected[k]}
            raise ViolationError(f"at {now}: job #{pk} ({job.task}) differs (db, model): {diff}")
    got = Counter(_letter_key(letter, model) for letter in letters)
    want = Counter(_model_letter_key(letter, model) for letter in model.letters)
    if got != want:
        raise ViolationError(
            f"at {now}: dead letters differ: db only {sorted((got - want).elements())}, "
            f"model only {sorted((want - got).elements())}"
        )


def _letter_key(letter: tuple, model: Model) -> tuple:
    job_id, task, args, retried, reason = letter
    kind = reason if reason.startswith("shed:") else reason.split(":", 1)[0]
    return (job_id, task, repr(args), retried, kind)


def _model_letter_key(letter: MLetter, model: Model) -> tuple:
    job_id = letter.job_id if letter.job_id in model.jobs else None  # pruned: SET_NULL
    return (job_id, letter.task, repr(letter.args), letter.retried, letter.kind)


def check_drained(model: Model, now: float) -> None:
    """Raise unless every due READY job left after a drain at ``now`` is held for a reason.

    Allowed reasons: a run of its debounce key is in flight (§4.5); its
    concurrency cap is full (a job of the task RUNNING); a defer-mode bucket of
    it, the task's or its key's, may be short of a token (a start of that bucket
    in the last period: weaker than the exact bucket, whose float refill the
    model does not follow).
    """
    for job in model.jobs.values():
        if job.status != READY or job.run_at > now:
            continue
        spec = model.specs[job.task]
        if spec.debounced and model.held_key(job, now):
            continue
        if spec.concurrency is not None and any(
            other.task == job.task and other.status == RUNNING for other in model.jobs.values()
        ):
            continue
        if model.buckets.may_wait(spec, job, now):
            continue
        raise ViolationError(
            f"after a drain at {now}: #{job.id} ({job.task}) is due and was not taken"
        )
