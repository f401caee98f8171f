"""Tasks of the flow-control tests: rate limits, concurrency caps, circuit breakers (§6).

A registered task with a rate limit, a cap or a breaker sends every claim of
the process through the flow-control gate. So that the rest of the suite
keeps the plain claim, these tasks are registered only on demand:
:func:`register` (the ``flow_tasks`` fixture, which unregisters them after the
test), or at import when ``DEBOUNCE_FLOW_TASKS=1`` (worker subprocesses of the
flow-control tests). Every run writes a :class:`~tests.testapp.models.CallLog`
row with its start and finish instants.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.utils import timezone

from django_debounce import CircuitBreaker, task
from django_debounce.models import Job
from django_debounce.signals import job_dead_lettered, job_finished, job_started
from django_debounce.tasks import Task

from .models import CallLog

_current = threading.local()


def _remember_job(sender: Any, job: Job, **kwargs: Any) -> None:
    _current.job_id = job.pk


job_started.connect(_remember_job, sender=Job, dispatch_uid="tests.testapp.tasks_flow.current_job")


class DownstreamError(Exception):
    """What a failing breaker task raises."""


def _record(name: str, tag: str, seconds: float = 0.0) -> None:
    log = CallLog.objects.create(
        task=name,
        key=tag,
        job_id=getattr(_current, "job_id", None),
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    if seconds > 0:
        time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


def rate(tag: str, seconds: float = 0.0) -> str:
    _record("flow.rate", tag, seconds)
    return tag


def rate_drop(tag: str, seconds: float = 0.0) -> str:
    _record("flow.rate_drop", tag, seconds)
    return tag


def capped(tag: str, seconds: float = 0.0) -> str:
    _record("flow.capped", tag, seconds)
    return tag


def guarded(tag: str, fail: bool = False) -> str:
    """Record the run; raise :class:`DownstreamError` when ``fail``."""
    _record("flow.guarded", tag)
    if fail:
        raise DownstreamError(f"downstream down ({tag})")
    return tag


def guarded_retrying(tag: str, fail: bool = False) -> str:
    _record("flow.guarded_retrying", tag)
    if fail:
        raise DownstreamError(f"downstream down ({tag})")
    return tag


def call_api(n: int) -> int:
    """B38: one call of a quota-limited API."""
    _record("b38.call_api", str(n))
    return n


def call_api_drop(n: int) -> int:
    _record("b38.call_api_drop", str(n))
    return n


def plain(tag: str) -> str:
    """No flow control: runs beside gated tasks."""
    _record("flow.plain", tag)
    return tag


#: name -> (function, options)
DECLARATIONS: dict[str, tuple[Any, dict[str, Any]]] = {
    "flow.rate": (rate, {"rate_limit": "10/s", "max_retries": 0}),
    "flow.rate_drop": (rate_drop, {"rate_limit": "10/s", "on_excess": "drop", "max_retries": 0}),
    "flow.capped": (capped, {"concurrency": 2, "max_retries": 3}),
    "flow.guarded": (
        guarded,
        {"circuit_breaker": CircuitBreaker(failures=3, reset="1m"), "max_retries": 0},
    ),
    "flow.guarded_retrying": (
        guarded_retrying,
        {
            "circuit_breaker": CircuitBreaker(failures=3, reset=30),
            "max_retries": 5,
            "min_backoff": "1s",
            "max_backoff": "1s",
        },
    ),
    "b38.call_api": (call_api, {"rate_limit": "10/m", "max_retries": 0}),
    "b38.call_api_drop": (
        call_api_drop,
        {"rate_limit": "10/m", "on_excess": "drop", "max_retries": 0},
    ),
    "flow.plain": (plain, {"max_retries": 0}),
}


def register() -> dict[str, Task[Any, Any]]:
    """Register every flow-control task (idempotent); return them by name."""
    return {
        name: task(name=name, **options)(func) for name, (func, options) in DECLARATIONS.items()
    }


def _log_signal(sender: Any, job: Job, signal: Any, **kwargs: Any) -> None:
    """In worker subprocesses: record each finish/dead-letter signal of a flow task."""
    if job.task_name in DECLARATIONS:
        name = "job_dead_lettered" if signal is job_dead_lettered else "job_finished"
        CallLog.objects.create(task=f"signal:{name}", key=job.task_name, job_id=job.pk)


if os.environ.get("DEBOUNCE_FLOW_TASKS") == "1":
    register()
    job_finished.connect(_log_signal, dispatch_uid="tests.testapp.tasks_flow.finished")
    job_dead_lettered.connect(_log_signal, dispatch_uid="tests.testapp.tasks_flow.dead_lettered")
