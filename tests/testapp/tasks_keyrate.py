"""The task of the per-key rate-limit process test (``rate_limit_per_key=``, decision 189).

Registered only on demand, as the flow-control tasks are (a gated task sends every
claim of its process through the gate): :func:`register` in the test process, or at
import when ``DEBOUNCE_KEYRATE_TASKS=1`` (the test's worker subprocesses). Each run
writes a :class:`~tests.testapp.models.CallLog` row (its key and process).
"""

from __future__ import annotations

import os
from typing import Any

from django.utils import timezone

from django_debounce import registry, task
from django_debounce.tasks import Task

from .models import CallLog

NAME = "kr.proc"
#: 2 runs a second per key (capacity 2); a key's window is 50 ms, so calls every 20 ms
#: would run it ~15 times a second without the limit.
OPTIONS: dict[str, Any] = {
    "debounce": "50ms",
    "debounce_max_wait": "200ms",
    "debounce_key": "{0}",
    "rate_limit_per_key": "2/s",
    "max_retries": 0,
}


def per_key(key: str, n: int) -> None:
    CallLog.objects.create(task=NAME, key=key, pid=os.getpid(), started_at=timezone.now())


def register() -> Task[Any, Any]:
    """Register the task (idempotent); return it."""
    return task(name=NAME, **OPTIONS)(per_key)


def unregister() -> None:
    registry.unregister(NAME)


if os.environ.get("DEBOUNCE_KEYRATE_TASKS") == "1":
    register()
