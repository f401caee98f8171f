"""The everything-on task of the attack process test (tests/processes/test_every_feature_at_once.py).

Registered only on demand (a gated task sends every claim of its process through the
gate): :func:`register` in the test process, or at import when
``DEBOUNCE_ATTACK_TASKS=1`` (the test's worker, producer and driver subprocesses).
Each run writes a :class:`~tests.testapp.models.CallLog` row: its key, the payload it
received, the job's attempt and claim instant, its process, start and finish.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.utils import timezone

from django_debounce import CircuitBreaker, registry, task
from django_debounce.tasks import Task

from .models import CallLog

NAME = "atk.all"
RATE = "4/s"


def merge(stored: tuple[Any, Any], new: tuple[Any, Any]) -> tuple[Any, Any]:
    """Fold the calls' (producer, seq) into one list: no merged call may be lost."""
    args, kwargs = stored
    _, new_kwargs = new
    seqs = list(kwargs.get("seqs") or [[kwargs.get("producer"), kwargs.get("seq")]])
    seqs.extend(new_kwargs.get("seqs") or [[new_kwargs.get("producer"), new_kwargs.get("seq")]])
    return list(args), {"seqs": seqs}


def everything(context: Any, key: str, producer: int = -1, seq: int = -1, seqs: Any = None) -> str:
    job = context.job
    log = CallLog.objects.create(
        task=NAME,
        key=key,
        job_id=job.pk,
        pid=os.getpid(),
        started_at=timezone.now(),
        payload={
            "args": [key],
            "kwargs": {"producer": producer, "seq": seq} if seqs is None else {"seqs": seqs},
            "attempt": job.attempts,
            "claim_started_at": job.started_at.isoformat() if job.started_at else None,
            "expires_at": job.expires_at.isoformat() if job.expires_at else None,
        },
    )
    slow = seq >= 0 and seq % 97 == 0  # a few runs outlive their 1 s timeout (checkpointed)
    steps = 30 if slow else 4
    try:
        for step in range(steps):
            context.set_progress(step + 1, steps, f"attempt {job.attempts} pid {os.getpid()}")
            context.checkpoint()  # JobCancelled after a cancel, JobTimeout past the timeout
            time.sleep(0.1 if slow else 0.03)
    except BaseException as exc:
        log.payload["raised"] = type(exc).__name__
        raise
    finally:
        log.finished_at = timezone.now()
        log.save(update_fields=["finished_at", "payload"])
    return "ok"


OPTIONS: dict[str, Any] = {
    "name": NAME,
    "takes_context": True,
    "debounce": "150ms",
    "debounce_max_wait": "600ms",
    "debounce_key": "{0}",
    "debounce_edge": "both",
    "debounce_merge": merge,
    "rate_limit_per_key": RATE,
    "concurrency": 3,
    "timeout": "1s",
    "expires": "5s",
    "max_retries": 1,
    "min_backoff": "100ms",
    "max_backoff": "200ms",
    "circuit_breaker": CircuitBreaker(failures=4, reset="300ms"),
}


def register() -> Task[Any, Any]:
    """Register the task (idempotent); return it."""
    if registry.lookup(NAME) is not None:
        return registry.lookup(NAME)  # type: ignore[return-value]
    return task(**OPTIONS)(everything)


def unregister() -> None:
    registry.unregister(NAME)


if os.environ.get("DEBOUNCE_ATTACK_TASKS") == "1":
    register()


def surrogate_note(context: Any) -> str:
    """Reports once (written at once), then a note no database can store (held back)."""
    CallLog.objects.create(
        task="atk.note", job_id=context.job.pk, pid=os.getpid(), started_at=timezone.now()
    )
    context.set_progress(1, 2, "fine")
    try:
        context.set_progress(2, 2, "half a pair \ud800")
    except Exception:  # noqa: BLE001 (a ProgressError here is the fix; keep running)
        pass
    return "returned"


if os.environ.get("DEBOUNCE_ATTACK_TASKS") == "1" and registry.lookup("atk.note") is None:
    task(name="atk.note", takes_context=True, max_retries=1)(surrogate_note)
