"""Tasks for the coalescing, merge and task-context tests (``coal.*``).

Worker and producer subprocesses know them through autodiscovery. They take
their context (``takes_context=True``), so each run records its own job id and
attempt without reaching into signals, and their key templates' ``{0}`` is the
first argument a caller passes, not the context.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.utils import timezone

from django_debounce import JobContext, debounced_task, task

from .models import CallLog

#: A producer call's id in the merge tests: unique per (producer, seq).
ID_STRIDE = 1_000_000


def call_ids(call: tuple[list[Any], dict[str, Any]]) -> set[int]:
    """Return the ids one stored or new call of ``coal.gather`` carries.

    A producer call is ``(key,)`` with ``producer=``/``seq=`` (as
    ``python -m tests.procs produce`` sends it): one id. A merged call is
    ``(key,)`` with ``ids=[…]``.
    """
    _, kwargs = call
    ids = set(kwargs.get("ids") or ())
    if kwargs.get("seq") is not None:
        ids.add(int(kwargs["producer"]) * ID_STRIDE + int(kwargs["seq"]))
    return ids


def union_ids(
    stored: tuple[list[Any], dict[str, Any]], new: tuple[list[Any], dict[str, Any]]
) -> tuple[list[Any], dict[str, Any]]:
    """``debounce_merge`` of ``coal.gather``: keep the key, store the union of both calls' ids."""
    return list(stored[0]), {"ids": sorted(call_ids(stored) | call_ids(new))}


def _log(name: str, context: JobContext, key: str, payload: dict[str, Any]) -> CallLog:
    return CallLog.objects.create(
        task=name,
        key=key,
        payload={
            **payload,
            "attempt": context.attempt,
            "calls_collapsed": context.calls_collapsed,
            "run_reason": context.run_reason,
        },
        job_id=context.job.pk if context.job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task(name="coal.charge", unique_key="charge:{0}", takes_context=True)
def charge(
    context: JobContext, key: str, producer: int | None = None, seq: int | None = None
) -> str:
    """A coalesced task: record the run, hold it RUNNING for 20 ms so calls coalesce into it."""
    log = _log("coal.charge", context, key, {"producer": producer, "seq": seq})
    time.sleep(0.02)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return key


@debounced_task(
    name="coal.gather",
    debounce="200ms",
    debounce_max_wait="1s",
    debounce_key="gather:{0}",
    debounce_merge=union_ids,
    takes_context=True,
)
def gather(
    context: JobContext,
    key: str,
    ids: list[int] | None = None,
    producer: int | None = None,
    seq: int | None = None,
) -> int:
    """A merging window: record every id the window's calls carried; return how many."""
    received = sorted(call_ids(([key], {"ids": ids, "producer": producer, "seq": seq})))
    log = _log("coal.gather", context, key, {"ids": received})
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])
    return len(received)
