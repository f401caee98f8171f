"""Tasks used across test modules (stable names, so subprocess workers know them)."""

from __future__ import annotations

import os
import time

from django.utils import timezone

from django_debounce import task

from .models import CallLog


@task(name="tests.noop")
def noop(*args: object, **kwargs: object) -> None:
    """Do nothing."""


@task(name="tests.record")
def record(*args: object, **kwargs: object) -> None:
    """Write one CallLog row with the arguments received."""
    now = timezone.now()
    CallLog.objects.create(
        task="tests.record",
        payload={"args": list(args), "kwargs": {k: repr(v) for k, v in kwargs.items()}},
        pid=os.getpid(),
        started_at=now,
        finished_at=now,
    )


@task(name="tests.sleep_then_record")
def sleep_then_record(seconds: float, tag: str = "") -> str:
    """Record start, sleep ``seconds`` (real time), record finish."""
    log = CallLog.objects.create(
        task="tests.sleep_then_record", key=tag, pid=os.getpid(), started_at=timezone.now()
    )
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return tag
