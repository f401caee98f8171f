"""The finish line of ``bench/peers.py``'s drain: a Redis counter that every no-op job bumps.

Each job runs one ``INCR`` (one round trip to Redis, ~0.05 ms on loopback, the
same for both workers). The job that makes it 1 writes the wall-clock start
time, the one that makes it ``DEBOUNCE_PEERS_JOBS`` writes the end time and
pushes to a list the benchmark waits on with ``BLPOP``, so nobody polls.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: Redis database of the benchmark (never 0: it is flushed before each run).
URL = os.environ.get("DEBOUNCE_PEERS_REDIS", "redis://127.0.0.1:6379/9")
#: The Celery broker of the bench apps: this Redis unless ``DEBOUNCE_BENCH_BROKER`` names
#: another (``bench/scale_out.py`` races RabbitMQ, ``amqp://…``); the counter stays on Redis.
BROKER = os.environ.get("DEBOUNCE_BENCH_BROKER") or URL
COUNT = "peers:count"
FIRST = "peers:first"
LAST = "peers:last"
DONE = "peers:done"

_client: Any = None
_lock = threading.Lock()


def client() -> Any:
    """Return this process's Redis client (thread-safe; one per process, made on first use)."""
    global _client
    if _client is None:
        import redis

        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(URL)
    return _client


#: Milliseconds each bench job sleeps before it counts (``bench/drain.py --sleep-ms``): an
#: I/O-bound job, whose thread releases the GIL while it waits (issue #23 item 4).
SLEEP_MS = float(os.environ.get("DEBOUNCE_PEERS_SLEEP_MS") or 0)


def hit() -> None:
    """Count one finished job; stamp the first and the last (``DEBOUNCE_PEERS_JOBS``).

    Sleeps ``SLEEP_MS`` milliseconds first when set (the same for every worker system).
    """
    if SLEEP_MS:
        time.sleep(SLEEP_MS / 1000)
    r = client()
    count = r.incr(COUNT)
    if count == 1:
        r.set(FIRST, repr(time.time()))
    if count == int(os.environ["DEBOUNCE_PEERS_JOBS"]):
        r.set(LAST, repr(time.time()))
        r.rpush(DONE, "1")
