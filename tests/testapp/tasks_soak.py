"""Tasks of the rate-accuracy and soak tests (issue #18 items 3 and 4).

Registered only on demand, as the flow-control tasks are (a rate-limited task
sends every claim of its process through the gate): :func:`register` in the
test process (unregistered after the test), or at import when
``DEBOUNCE_SOAK_TASKS=1`` (worker and producer subprocesses of these tests).

Every run writes one :class:`~tests.testapp.models.CallLog` row at the start
of its body (``started_at``: the package's clock, ``timezone.now()``), with
the job's id and attempt and the call ids the run serves, and sets its
``finished_at`` at the end of the body: a run's interval, for the overlap,
cap and exactly-once checks of ``tests/soak_checks.py``.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from django.utils import timezone

from django_debounce import JobContext, registry, task
from django_debounce.tasks import Task

from .models import CallLog


class SoakTaskError(Exception):
    """What a failing soak task raises."""


def _run(name: str, context: JobContext, key: str, ids: list[str], seconds: float) -> None:
    job = context.job
    log = CallLog.objects.create(
        task=name,
        key=key,
        payload={"ids": ids, "attempt": context.attempt},
        job_id=job.pk if job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    if seconds > 0:
        time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


# -- rate accuracy ---------------------------------------------------------------------------


def rated(context: JobContext, tag: str) -> str:
    """A short run (0-10 ms) of a rate-limited task (``20/s``, a bucket of 20)."""
    _run("ra.rate", context, tag, [tag], random.random() / 100)
    return tag


def rated_trickle(context: JobContext, tag: str) -> str:
    """As :func:`rated`, at 5 a second with a bucket of 2 (it fills in 0.4 s)."""
    _run("ra.trickle", context, tag, [tag], random.random() / 100)
    return tag


def rated_small_burst(context: JobContext, tag: str) -> str:
    """As :func:`rated`, with a bucket of 5 (a burst smaller than the rate)."""
    _run("ra.small_burst", context, tag, [tag], random.random() / 100)
    return tag


# -- the soak --------------------------------------------------------------------------------


def union(stored: tuple[list[Any], dict[str, Any]], new: tuple[list[Any], dict[str, Any]]) -> Any:
    """``debounce_merge``: keep the key, store the union of both calls' ids (first seen first)."""
    ids = list(stored[0][1])
    ids += [item for item in new[0][1] if item not in ids]
    return [stored[0][0], ids], {}


def debounced(context: JobContext, key: str, item: str) -> None:
    """Debounced, first call's payload: the run serves every call that joined its window."""
    _run("soak.debounced", context, key, [item], random.random() / 50)


def merged(context: JobContext, key: str, ids: list[str]) -> None:
    """Debounced with ``debounce_merge``: the run serves exactly the ids in its payload."""
    _run("soak.merged", context, key, list(ids), random.random() / 50)


def bulk(context: JobContext, key: str, ids: list[str]) -> None:
    """As :func:`merged`, enqueued with ``delay_many``."""
    _run("soak.bulk", context, key, list(ids), random.random() / 50)


def limited(context: JobContext, item: str) -> None:
    _run("soak.rated", context, "", [item], random.random() / 100)


def capped(context: JobContext, item: str) -> None:
    """Concurrency 2: each run holds its slot for 20-60 ms."""
    _run("soak.capped", context, "", [item], 0.02 + random.random() / 25)


def expiring(context: JobContext, item: str) -> None:
    """Concurrency 1, each run 300 ms: calls arrive faster than that, so some expire (250 ms)."""
    _run("soak.expiring", context, "", [item], 0.3)


def dropped(context: JobContext, item: str) -> None:
    _run("soak.dropped", context, "", [item], 0.0)


def failing(context: JobContext, item: str, fail_runs: int) -> None:
    """Fails its first ``fail_runs`` runs (more than its retries: ends in a dead letter)."""
    _run("soak.failing", context, "", [item], 0.0)
    if context.attempt <= fail_runs:
        raise SoakTaskError(f"{item}: run {context.attempt} of {fail_runs} failing")


def guarded(context: JobContext, item: str) -> None:
    """Behind a circuit breaker that never opens (it never fails): a gated task registered."""
    _run("soak.guarded", context, "", [item], 0.0)


#: The soak's failing task: runs at most this many times (1 + retries).
FAILING_RUNS = 3

#: name -> (function, options)
DECLARATIONS: dict[str, tuple[Any, dict[str, Any]]] = {
    # 20 a second with a bucket of 20 (the rate) or 5 (a burst smaller than the rate).
    "ra.rate": (rated, {"rate_limit": "20/s", "max_retries": 0}),
    "ra.small_burst": (
        rated_small_burst,
        {"rate_limit": "20/s", "rate_limit_burst": 5, "max_retries": 0},
    ),
    # A bucket that fills faster than a worker's poll interval (1 s).
    "ra.trickle": (rated_trickle, {"rate_limit": "5/s", "rate_limit_burst": 2, "max_retries": 0}),
    "soak.debounced": (
        debounced,
        {"debounce": "300ms", "debounce_max_wait": "1s", "debounce_key": "d:{0}"},
    ),
    "soak.merged": (
        merged,
        {
            "debounce": "300ms",
            "debounce_max_wait": "1s",
            "debounce_key": "m:{0}",
            "debounce_merge": union,
        },
    ),
    "soak.bulk": (
        bulk,
        {
            "debounce": "200ms",
            "debounce_max_wait": "800ms",
            "debounce_key": "b:{0}",
            "debounce_merge": union,
        },
    ),
    "soak.rated": (limited, {"rate_limit": "10/s", "max_retries": 0}),
    "soak.capped": (capped, {"concurrency": 2, "max_retries": 0}),
    # Expiry is judged when a job starts: with one run at a time, each 300 ms, and about
    # four calls a second, jobs wait past their 250 ms whatever the machine's speed.
    "soak.expiring": (
        expiring,
        {"expires": "250ms", "concurrency": 1, "priority": -10, "max_retries": 0},
    ),
    "soak.dropped": (dropped, {"rate_limit": "5/s", "on_excess": "drop", "max_retries": 0}),
    "soak.failing": (
        failing,
        {
            "max_retries": FAILING_RUNS - 1,
            "min_backoff": "100ms",
            "max_backoff": "300ms",
        },
    ),
    "soak.guarded": (guarded, {"circuit_breaker": None, "max_retries": 0}),
}


def _options(options: dict[str, Any]) -> dict[str, Any]:
    from django_debounce import CircuitBreaker

    if "circuit_breaker" in options:
        options = {**options, "circuit_breaker": CircuitBreaker(failures=1000, reset="1m")}
    return options


def register() -> dict[str, Task[Any, Any]]:
    """Register every task of this module (idempotent); return them by name."""
    return {
        name: task(name=name, takes_context=True, **_options(options))(func)
        for name, (func, options) in DECLARATIONS.items()
    }


def unregister() -> None:
    for name in DECLARATIONS:
        registry.unregister(name)


if os.environ.get("DEBOUNCE_SOAK_TASKS") == "1":
    register()
