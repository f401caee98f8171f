"""The job of ``bench/latency.py``: push its start time to a Redis list the benchmark waits on."""

from __future__ import annotations

import os
import time

from django_debounce import task

#: Redis database of the benchmark (never 0: it is flushed before each run).
URL = os.environ.get("DEBOUNCE_LATENCY_REDIS", "redis://127.0.0.1:6379/10")
STARTS = "latency:starts"

_client = None


@task(name="bench.latency.stamp", max_retries=0)
def stamp(tag: str) -> None:
    """Push ``"<tag> <wall-clock start>"`` (one RPUSH, ~0.05 ms on loopback)."""
    global _client
    started = time.time()
    if _client is None:
        import redis

        _client = redis.Redis.from_url(URL)
    _client.rpush(STARTS, f"{tag} {started!r}")
