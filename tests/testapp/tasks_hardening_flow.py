"""Tasks of the flow-control hardening tests (names start with ``hf.``).

Only ungated tasks are registered at import (a rate limit, cap or breaker
would send every claim of the suite through the flow-control gate); the gated
one is registered on demand by :func:`register_gated` (or at import in a
worker subprocess started with ``DEBOUNCE_HF_GATED=1``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.utils import timezone

from django_debounce import CircuitBreaker, debounced_task, registry, task
from django_debounce.tasks import Task

from .models import CallLog


class FlakyError(Exception):
    """Raised by :func:`flaky` on purpose."""


def _log(name: str, tag: str) -> None:
    now = timezone.now()
    CallLog.objects.create(task=name, key=tag, pid=os.getpid(), started_at=now, finished_at=now)


@task(name="hf.flaky", max_retries=10_000)
def flaky(tag: str) -> None:
    """Log ``tag`` and fail (retried up to 10,000 times)."""
    _log("hf.flaky", tag)
    raise FlakyError(f"{tag} failed")


@task(name="hf.plain")
def plain(tag: str) -> str:
    """Log ``tag``; an ungated task."""
    _log("hf.plain", tag)
    return tag


def _gated(tag: str) -> str:
    _log("hf.gated", tag)
    return tag


def _timed(name: str, context: Any, tag: str, seconds: float) -> None:
    log = CallLog.objects.create(
        task=name, key=tag, job_id=context.job.pk, pid=os.getpid(), started_at=timezone.now()
    )
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


def _capped(context: Any, tag: str, seconds: float = 0.0) -> str:
    _timed("hf.capped", context, tag, seconds)
    return tag


def _breaker(context: Any, tag: str, seconds: float = 0.0) -> str:
    _timed("hf.breaker", context, tag, seconds)
    if tag.startswith("fail"):
        raise FlakyError(f"{tag} failed")
    return tag


#: The gated tasks, registered on demand (see the module docstring).
GATED = ("hf.gated", "hf.capped", "hf.breaker")


def register_gated() -> list[Task[..., str]]:
    """Register the gated tasks; unregister them with ``registry.unregister`` (see ``GATED``).

    ``hf.gated``: rate limit 100/s. ``hf.capped``: concurrency 2, takes a
    context, logs start and finish. ``hf.breaker``: a breaker opening at the
    first failure, probing after 1 s; a tag starting with ``fail`` raises.
    """
    return [
        task(name="hf.gated", rate_limit="100/s")(_gated),
        task(name="hf.capped", concurrency=2, takes_context=True)(_capped),
        task(
            name="hf.breaker",
            max_retries=0,
            takes_context=True,
            circuit_breaker=CircuitBreaker(failures=1, reset="1s"),
        )(_breaker),
    ]


if os.environ.get("DEBOUNCE_HF_GATED") == "1" and registry.lookup("hf.gated") is None:
    register_gated()


def _union(stored: tuple[list[Any], dict[str, Any]], new: tuple[list[Any], dict[str, Any]]) -> Any:
    ids = sorted(set(stored[1].get("ids", [])) | set(new[1].get("ids", [])))
    return stored[0], {"ids": ids}


@debounced_task(
    name="hf.window_merge",
    debounce="1m",
    debounce_max_wait="10m",
    debounce_key="{0}",
    debounce_merge=_union,
)
def window_merge(key: str, ids: list[int] | None = None) -> None:
    """A merging debounced task (the locked-row path of an enqueue, §4.8)."""
    _log("hf.window_merge", f"{key}:{ids}")
