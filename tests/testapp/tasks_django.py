"""Django's own ``@task`` functions on ``DebounceBackend`` (issue #10 item 4).

``tests/settings.py`` sets ``TASKS["default"]`` to the backend, so each
``@task`` here is registered as ``tests.testapp.tasks_django.<name>`` when
this module is imported (by ``tasks.py``, at app start: the worker too).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from django.utils import timezone

from tests.testapp.models import CallLog

try:  # Django 6.0+
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


def _log(name: str, key: str, payload: dict[str, Any]) -> CallLog:
    now = timezone.now()
    return CallLog.objects.create(
        task=name, key=key, payload=payload, pid=os.getpid(), started_at=now, finished_at=now
    )


@task
def add(a: int, b: int) -> int:
    """A plain Django task: returns the sum, records the call."""
    _log("dj.add", "", {"args": [a, b]})
    return a + b


@task(priority=10, queue_name="django")
def on_django_queue(tag: str) -> str:
    _log("dj.queue", tag, {})
    return tag


@task(debounce="10s", debounce_key="report:{user_id}", debounce_max_wait="60s")
def report(user_id: int, revision: int = 0) -> dict[str, int]:
    """Debounced: one run per quiet 10 s per user, at most 60 s after the window opened."""
    _log("dj.report", str(user_id), {"revision": revision})
    return {"user_id": user_id, "revision": revision}


@task(
    debounce="10s",
    debounce_key="latest:{0}",
    debounce_max_wait="60s",
    debounce_replace_payload=True,
)
def report_latest(user_id: int, revision: int = 0) -> int:
    """Debounced, running with the newest call's arguments."""
    _log("dj.report_latest", str(user_id), {"revision": revision})
    return revision


@task(
    debounce="10s",
    debounce_key="leading:{user_id}",
    debounce_max_wait="60s",
    debounce_edge="leading",
)
def report_leading(user_id: int, revision: int = 0) -> int:
    """Debounced on the leading edge: a burst's first call runs at once (decision 180)."""
    _log("dj.report_leading", str(user_id), {"revision": revision})
    return revision


@task(debounce="1s", debounce_key="slow:{0}", debounce_max_wait="10s")
def slow_report(user_id: int, seconds: float, revision: int = 0) -> int:
    """Debounced with a short window; sleeps ``seconds`` (real time) while it runs."""
    log = CallLog.objects.create(
        task="dj.slow_report",
        key=str(user_id),
        payload={"revision": revision},
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return revision


@task(max_retries=1, min_backoff="1s", max_backoff="1s")
def always_fails(tag: str) -> None:
    """Raise every time: one retry, then FAILED with a dead letter."""
    _log("dj.fails", tag, {})
    raise ValueError(f"boom {tag}")


@task(takes_context=True)
def with_context(context: Any, tag: str) -> dict[str, Any]:
    """Return what Django's TaskContext says about this run."""
    _log("dj.context", tag, {})
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": str(context.task_result.status),
        "context": type(context).__name__,
    }


@task
async def async_add(a: int, b: int) -> int:
    """An ``async def`` Django task."""
    await asyncio.sleep(0)
    return a + b


@task(expires="1h")
def expiring(tag: str) -> None:
    _log("dj.expiring", tag, {})
