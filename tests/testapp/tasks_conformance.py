"""The debounce scenarios of the conformance suite, run by every executor (tests/processes/test_conformance.py).

No task names an executor: each follows ``DEBOUNCE_EXECUTOR``, which the suite
sets per mode in its subprocesses. Every run writes a
:class:`~tests.testapp.models.CallLog` row with the payload it received and
its attempt.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from decimal import Decimal
from typing import Any

from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.context import JobContext

from .models import CallLog


def _log(name: str, context: JobContext, key: str, payload: dict[str, Any]) -> CallLog:
    return CallLog.objects.create(
        task=name,
        key=key,
        payload={"attempt": context.attempt, **payload},
        job_id=context.job.pk if context.job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@debounced_task(
    name="conf.collapse",
    debounce="1s",
    debounce_max_wait="30s",
    debounce_key="c:{key}",
    takes_context=True,
)
def collapse(context: JobContext, key: str, seq: int) -> None:
    """A burst on one key runs once, with the first call's payload."""
    _log("conf.collapse", context, key, {"seq": seq})


@debounced_task(
    name="conf.latest",
    debounce="1s",
    debounce_max_wait="30s",
    debounce_key="l:{key}",
    debounce_replace_payload=True,
    takes_context=True,
)
def latest(context: JobContext, key: str, seq: int) -> None:
    """A burst on one key runs once, with the newest call's payload (replace_payload)."""
    _log("conf.latest", context, key, {"seq": seq})


@debounced_task(
    name="conf.ceiling",
    debounce="1s",
    debounce_max_wait="2s",
    debounce_key="m:{key}",
    takes_context=True,
)
def ceiling(context: JobContext, key: str, seq: int) -> None:
    """Calls every 300 ms never leave a quiet second: the max wait forces the run."""
    _log("conf.ceiling", context, key, {"seq": seq})


@debounced_task(
    name="conf.slow",
    debounce="200ms",
    debounce_max_wait="5s",
    debounce_key="s:{key}",
    takes_context=True,
)
def slow(context: JobContext, key: str, seconds: float) -> None:
    """A run long enough for a call to arrive while it runs."""
    log = _log("conf.slow", context, key, {"seconds": seconds})
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


@task(name="conf.types", takes_context=True)
def types(
    context: JobContext, ident: uuid.UUID, amount: Decimal, when: dt.datetime, pair: list[int]
) -> None:
    """Record the types and values the codec delivered (§5)."""
    _log(
        "conf.types",
        context,
        str(ident),
        {
            "types": [type(v).__name__ for v in (ident, amount, when, pair)],
            "values": [str(ident), str(amount), when.isoformat(), pair],
        },
    )


@task(
    name="conf.flaky", takes_context=True, max_retries=3, min_backoff="200ms", max_backoff="300ms"
)
def flaky(context: JobContext, key: str, fail_times: int) -> int:
    """Raise on the first ``fail_times`` attempts, then return the attempt."""
    _log("conf.flaky", context, key, {})
    if context.attempt <= fail_times:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(
    name="conf.broken", takes_context=True, max_retries=1, min_backoff="200ms", max_backoff="300ms"
)
def broken(context: JobContext, key: str) -> None:
    """Always raise: two runs, then a dead letter."""
    _log("conf.broken", context, key, {})
    raise ValueError(f"broken {key}")
