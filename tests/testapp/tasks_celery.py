"""Tasks the Celery executor's tests run in a real ``celery worker`` (tests/processes/contrib/celery/test_celery_executor.py).

Every run writes one :class:`~tests.testapp.models.CallLog` row (task, tag,
attempt, process id), so a test counts runs across processes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.context import JobContext

from .models import CallLog


def _log(name: str, context: JobContext, tag: str, **payload: Any) -> CallLog:
    return CallLog.objects.create(
        task=name,
        key=tag,
        payload={"attempt": context.attempt, **payload},
        job_id=context.job.pk if context.job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task(name="cel.record", executor="celery", takes_context=True)
def record(context: JobContext, tag: str, seconds: float = 0.0) -> dict[str, Any]:
    """Record a run, sleep ``seconds``, record its end; return the tag and the process id."""
    log = _log("cel.record", context, tag)
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return {"tag": tag, "pid": os.getpid()}


@task(name="cel.gate", executor="celery", takes_context=True)
def gate(context: JobContext, tag: str, path: str) -> dict[str, Any]:
    """Record a run, block until the file ``path`` exists (a test's barrier), record its end."""
    from .tasks_reliability import wait_for_file

    log = _log("cel.gate", context, tag)
    wait_for_file(path)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return {"tag": tag, "pid": os.getpid()}


@task(name="cel.slow_first", executor="celery", takes_context=True, max_retries=2)
def slow_first(context: JobContext, tag: str) -> str:
    """Record the run; the first attempt hangs for a minute (its worker is killed meanwhile)."""
    _log("cel.slow_first", context, tag)
    if context.attempt == 1:
        time.sleep(60)
    return f"done on attempt {context.attempt}"


@debounced_task(debounce="300ms", debounce_max_wait="5s", debounce_key="stacked:{key}")
@shared_task(name="cel.stacked")
def stacked(key: str, n: int = 0) -> str:
    """A Celery task routed through a debounce window by the decorator above it."""
    CallLog.objects.create(
        task="cel.stacked", key=key, payload={"n": n}, pid=os.getpid(), started_at=timezone.now()
    )
    return f"{key}:{n}"


@debounced_task(debounce="1s", debounce_max_wait="5s", debounce_key="bound:{0}")
@shared_task(bind=True, name="cel.bound")
def bound(self: Any, key: str) -> str:
    """A bound Celery task under the decorator: Celery passes ``self``, callers never do."""
    return f"{self.name}:{key}"


@task(name="cel.fails", executor="celery", max_retries=2, min_backoff="10s", max_backoff="10s")
def fails(tag: str) -> None:
    """Always raise (a retry after 10 s, then a dead letter)."""
    raise RuntimeError(f"no luck for {tag}")


@task(name="cel.on_worker", executor="worker")
def on_worker(tag: str) -> str:
    """A task the built-in worker runs even when DEBOUNCE_EXECUTOR is "celery"."""
    return tag


@task(name="cel.flaky", executor="celery", takes_context=True, min_backoff="1s", max_backoff="1s")
def flaky(context: JobContext, tag: str) -> dict[str, Any]:
    """Raise on the first attempt, succeed on the next (issue #17 item 10)."""
    if context.attempt == 1:
        raise RuntimeError(f"first try of {tag}")
    return {"tag": tag, "attempt": context.attempt}


@task(name="cel.always_fails", executor="celery", max_retries=1, min_backoff="1s", max_backoff="1s")
def always_fails(tag: str) -> None:
    """Raise on every attempt: one retry after 1 s, then a dead letter."""
    raise RuntimeError(f"no luck for {tag}")


@debounced_task(debounce="300ms", debounce_max_wait="5s", debounce_key="request:{0}")
@shared_task(bind=True, name="cel.bound_request")
def bound_request(self: Any, key: str) -> dict[str, Any]:
    """A bound Celery task that returns what Celery's request tells it (issue #17 item 11)."""
    return {"id": self.request.id, "hostname": self.request.hostname, "key": key}


@task(name="cel.tuple_key_result", executor="celery")
def tuple_key_result() -> dict[Any, str]:
    """Return a dict with a tuple key: JSON cannot store it (stored as a short repr)."""
    CallLog.objects.create(task="cel.tuple_key_result", pid=os.getpid())
    return {(1, 2): "pair"}


@task(name="cel.progress", executor="celery", takes_context=True)
def progress(context: JobContext, path: str) -> str:
    """Report 2 of 5, block until the file ``path`` exists, then report 5 of 5 and return."""
    from .tasks_reliability import wait_for_file

    context.set_progress(2, 5, "halfway there")
    wait_for_file(path)
    context.set_progress(5, 5, "all done")  # within a second of the first? held, then flushed
    return "reported"
