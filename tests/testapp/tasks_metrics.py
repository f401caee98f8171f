"""Tasks for the metrics and logging tests (names start with ``met.``; queue ``metrics``)."""

from __future__ import annotations

import time

from django_debounce import debounced_task, task

from .tasks_worker import log


@debounced_task(
    name="met.burst", debounce="10s", debounce_max_wait="60s", debounce_key="{key}", queue="metrics"
)
def burst(key: str, n: int = 0) -> str:
    log("met.burst", key)
    return key


@debounced_task(
    name="met.fast", debounce="300ms", debounce_max_wait="1s", debounce_key="{key}", queue="metrics"
)
def fast(key: str, n: int = 0) -> str:
    """A window short enough for a real-time burst in a subprocess test."""
    log("met.fast", key)
    return key


@task(name="met.unique", unique_key="u:{0}", queue="metrics")
def unique(key: str) -> str:
    log("met.unique", key)
    return key


@task(name="met.plain", queue="metrics")
def plain(tag: str, seconds: float = 0.0) -> str:
    time.sleep(seconds)
    log("met.plain", tag)
    return tag


class MetricsTestError(Exception):
    """Raised on purpose by ``met.fail``."""


@task(name="met.fail", queue="metrics", max_retries=1, min_backoff="1s", max_backoff="1s")
def fail(tag: str) -> None:
    log("met.fail", tag)
    raise MetricsTestError(f"failing {tag}")
