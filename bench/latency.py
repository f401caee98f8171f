# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: idle enqueue→start latency, with and without LISTEN/NOTIFY (issue #10, #12 item 4).

    python3 dev.py bench latency                       # 200 samples per row, poll 1 s
    .venv/bin/python bench/latency.py --samples 50 --modes notify

PostgreSQL and Redis (the job pushes its start time to a Redis list the
benchmark waits on with ``BLPOP``, so nobody polls the database). For each
wake-up mode (``notify``: LISTEN/NOTIFY; ``poll``: none, the worker polls every
``--poll`` seconds, Django's ``DEBOUNCE_POLL_INTERVAL`` default 1 s) it starts one
``run_debounce_worker`` subprocess and, one job at a time with the worker idle
in between (a random pause of 50 ms plus up to one poll interval, so a job lands at
a random point of the worker's poll cycle), measures:

* ``due now``: from just before ``delay()`` to the job's first line;
* ``due later``: ``apply_async(countdown=--later)``; from the job's ``run_at`` to
  its first line (how late a job due later starts).

Prints median, p95, p99 and max in milliseconds per mode and scenario, and
writes the raw samples as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

SETTINGS = "bench.latencyapp.settings"


def worker(args: argparse.Namespace, mode: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        DEBOUNCE_LATENCY_WAKEUP=mode,
        DEBOUNCE_LATENCY_POLL=str(args.poll),
        DEBOUNCE_LATENCY_REDIS=args.redis,
        DEBOUNCE_LATENCY_CONN_MAX_AGE=args.conn_max_age or "",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", "run_debounce_worker", "-v", "0", "--settings", SETTINGS],
        cwd=ROOT,
        env=env,
    )


def wait_start(r: Any, proc: subprocess.Popen[bytes], tag: str) -> float:
    """Block until the job ``tag`` pushed its start; return that wall-clock time."""
    from bench.latencyapp.tasks import STARTS

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        item = r.blpop([STARTS], timeout=1)
        if item:
            got, started = item[1].decode().split()
            if got == tag:
                return float(started)
        elif proc.poll() is not None:
            raise SystemExit(f"run_debounce_worker exited with status {proc.returncode}")
    raise SystemExit(f"job {tag} did not start within 30 s")


def measure(args: argparse.Namespace, mode: str, r: Any) -> dict[str, list[float]]:
    from bench.latencyapp.tasks import stamp

    proc = worker(args, mode)

    def pause() -> None:
        # The worker is idle again, and the job lands at a random point of its poll
        # cycle (a job's end wakes the worker, which then sleeps a whole poll: a fixed
        # short pause would always land early in that sleep).
        time.sleep(0.05 + random.uniform(0, args.poll))

    samples: dict[str, list[float]] = {"due now": [], "due later": []}
    try:
        for i in range(5):  # warm up: Django, the connections, the listener
            stamp.delay(f"warm-{mode}-{i}")
            wait_start(r, proc, f"warm-{mode}-{i}")
        time.sleep(1.0)
        for i in range(args.samples):
            pause()
            tag = f"{mode}-now-{i}"
            before = time.time()
            stamp.delay(tag)
            samples["due now"].append((wait_start(r, proc, tag) - before) * 1000)
        for i in range(args.samples):
            pause()
            tag = f"{mode}-later-{i}"
            job = stamp.apply_async(args=[tag], countdown=args.later)
            samples["due later"].append((wait_start(r, proc, tag) - job.run_at.timestamp()) * 1000)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return samples


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=200, help="jobs per mode and scenario")
    parser.add_argument("--poll", type=float, default=1.0, help="the worker's poll interval, s")
    parser.add_argument("--later", type=float, default=0.3, help="countdown of due-later jobs, s")
    parser.add_argument(
        "--modes", default="notify,poll", help="DEBOUNCE_WAKEUP values, comma-separated"
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/10", help="Redis for stamps")
    parser.add_argument(
        "--conn-max-age", help="the worker's CONN_MAX_AGE: seconds or None (default 0, Django's)"
    )
    parser.add_argument("--json", type=Path, help="write the raw samples (ms) here")
    add_db_arguments(parser, "bench_wake_latency")
    args = parser.parse_args()
    setup(args)
    import redis

    import bench.latencyapp.tasks  # noqa: F401  (registers the task in this process)

    r = redis.Redis.from_url(args.redis)
    r.flushdb()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for mode in args.modes.split(","):
            print(f"measuring {mode} ({args.samples} samples per scenario)…", file=sys.stderr)
            results[mode] = measure(args, mode, r)
    finally:
        teardown(args)
    rows = []
    for mode, scenarios in results.items():
        for scenario, values in scenarios.items():
            rows.append(
                [
                    mode,
                    scenario,
                    len(values),
                    f"{statistics.median(values):.1f}",
                    f"{quantile(values, 95):.1f}",
                    f"{quantile(values, 99):.1f}",
                    f"{max(values):.1f}",
                ]
            )
    print()
    print(
        f"idle worker, poll {args.poll} s, due-later countdown {args.later} s, "
        f"CONN_MAX_AGE {args.conn_max_age or 0}; milliseconds"
    )
    print(table(["wake-up", "job", "samples", "median", "p95", "p99", "max"], rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
