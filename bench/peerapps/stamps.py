"""The start stamp of the idle-latency scenario, shared by every peer's ``stamp`` task.

A job pushes ``time.time()`` at its first line to the Redis list ``lat:<tag>``;
the benchmark waits on it with ``BLPOP`` (nobody polls).
"""

from __future__ import annotations

import time

from bench.peersapp import counter


def push(tag: str) -> None:
    """Record that the job ``tag`` started now (wall clock, seconds)."""
    counter.client().rpush(f"lat:{tag}", repr(time.time()))
