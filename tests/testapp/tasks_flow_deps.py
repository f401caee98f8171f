"""Tasks for the dependency, expiry and dead-letter sweep tests (names start with ``dep.``)."""

from __future__ import annotations

import os

from django.utils import timezone

from django_debounce import debounced_task, task

from .models import CallLog


class StepError(Exception):
    """Raised by the tasks below that fail on purpose."""


def _log(name: str, tag: str) -> None:
    now = timezone.now()
    CallLog.objects.create(task=name, key=tag, pid=os.getpid(), started_at=now, finished_at=now)


@task(name="dep.step")
def step(tag: str) -> str:
    """Write one CallLog row keyed ``tag``; return ``tag``."""
    _log("dep.step", tag)
    return tag


@task(name="dep.fail", max_retries=0)
def fail(tag: str) -> None:
    """Log ``tag``, then fail for good (no retries)."""
    _log("dep.fail", tag)
    raise StepError(f"{tag} failed")


@task(name="dep.refresh")
def refresh(search_id: int) -> int:
    """B40: refresh one saved search (logs the id)."""
    _log("dep.refresh", str(search_id))
    return search_id


@debounced_task(name="dep.window", debounce="1m", debounce_max_wait="10m", debounce_key="{0}")
def window(key: str, version: int = 0) -> None:
    """A debounced task for the slide cases (§4.2)."""
    _log("dep.window", f"{key}:{version}")


@task(name="dep.gated_fail", max_retries=0)
def gated_fail(tag: str) -> None:
    """Log ``start``, wait for the test to open ``GATES[tag]`` (tasks_worker), then fail."""
    from .tasks_worker import wait_gate

    _log("dep.gated_fail", tag)
    wait_gate(tag)
    raise StepError(f"{tag} failed")
