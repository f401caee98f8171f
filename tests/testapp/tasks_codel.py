"""Tasks for the CoDel tests (names start with ``codel.``; queues ``search`` and ``codelpg``).

Each run writes a ``CallLog`` row (task, job id, pid), so runs can be counted
across processes.
"""

from __future__ import annotations

import os
import time

from django.utils import timezone

from django_debounce import debounced_task, task

from .models import CallLog


def _log(name: str, job_id: int | None = None, **payload: object) -> None:
    now = timezone.now()
    CallLog.objects.create(
        task=name, payload=payload, job_id=job_id, pid=os.getpid(), started_at=now, finished_at=now
    )


@task(name="codel.refresh_s", queue="search", on_excess="drop")
def refresh_s(n: int) -> None:
    """B40: a saved-search refresh nobody needs once it is stale (may be shed)."""
    _log("codel.refresh_s", n=n)


@task(name="codel.bill", queue="search")
def bill(n: int) -> None:
    """B40: billing in the same queue, ``on_excess="defer"``: never shed."""
    _log("codel.bill", n=n)


@debounced_task(
    name="codel.refresh_debounced",
    queue="search",
    on_excess="drop",
    debounce="30s",
    debounce_max_wait="10m",
    debounce_key="user:{user}",
)
def refresh_debounced(user: str, n: int = 0) -> None:
    """B40: a debounced drop-task; its wait counts from ``run_at``, not from the window's opening."""
    _log("codel.refresh_debounced", user=user, n=n)


@task(name="codel.slow_drop", queue="codelpg", on_excess="drop")
def slow_drop(n: int) -> None:
    """Real-process test: a 30 ms job that may be shed."""
    started = timezone.now()
    time.sleep(0.03)
    CallLog.objects.create(
        task="codel.slow_drop",
        payload={"n": n},
        pid=os.getpid(),
        started_at=started,
        finished_at=timezone.now(),
    )
