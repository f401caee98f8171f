# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: draining 10,000 due no-op jobs, ours beside Celery on Redis, in one run (issue #12).

    python3 dev.py bench drain                      # 10,000 jobs, 3 rounds
    python3 dev.py bench drain -- --smoke           # 300 jobs, 1 round: the scripts still run
    python3 dev.py bench drain -- --prefetch 0 20 100
    python3 dev.py bench drain -- --sleep-ms 10 --jobs 1000   # I/O-bound jobs: threads must scale

Scenarios (each a row): one worker process at concurrency 1 (ours: ``run_debounce_worker
--burst``, inline; Celery: the ``solo`` pool), one process at concurrency 4 (ours:
threads; Celery: ``--celery-pool``, prefork by default), and two processes at
concurrency 1 each. Every job bumps one Redis counter (``bench.peersapp.counter``), the
same for both sides; the time is from starting the worker process(es) to the last job
("whole") and from the first job to the last ("steady"). Our side is run once per
``--prefetch`` value (``DEBOUNCE_PREFETCH``; the default's row says ``default``);
``--sleep-ms N`` makes every job sleep N ms before it counts, on both sides (an I/O-bound
job: issue #23 item 4's threads that add throughput); the
ratio column is ours / Celery of the same round (median over ``--rounds``; the side that
goes first alternates). ``--json FILE`` writes every raw figure. PostgreSQL and Redis on
loopback, as ``bench/peers.py`` (whose helpers this reuses).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, add_db_arguments, setup, table, teardown  # noqa: E402
from bench.peers import (  # noqa: E402
    NOOP,
    celery_worker_cmd,
    fill_jobs,
    our_worker_cmd,
    redis_client,
    stamps,
    worker_env,
)

#: (label, processes, concurrency per process)
SCENARIOS = [("1 process, C=1", 1, 1), ("1 process, C=4", 1, 4), ("2 processes, C=1", 2, 1)]


def wait_all(r: Any, procs: list[subprocess.Popen[bytes]], timeout: float, what: str) -> None:
    """Block until the last job stamped the end; fail on timeout or when every worker died."""
    from bench.peersapp import counter

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.blpop([counter.DONE], timeout=1):
            return
        if all(proc.poll() is not None for proc in procs):
            raise SystemExit(f"{what} exited after {int(r.get(counter.COUNT) or 0)} jobs")
    raise SystemExit(f"{what}: not done after {timeout:.0f} s ({r.get(counter.COUNT)} jobs)")


def drain_ours(
    args: argparse.Namespace, processes: int, concurrency: int, prefetch: str
) -> tuple[float, float]:
    """Drain ``--jobs`` pre-enqueued jobs with ``processes`` burst workers; return jobs/s."""
    from django_debounce.models import Job

    fill_jobs(args.jobs)
    r = redis_client(args.redis)
    r.flushdb()
    env = worker_env(args)
    if prefetch != "default":
        env["DEBOUNCE_PEERS_PREFETCH"] = prefetch
    started = time.time()
    procs = [
        subprocess.Popen([sys.executable, *our_worker_cmd(concurrency)], cwd=ROOT, env=env)
        for _ in range(processes)
    ]
    try:
        wait_all(r, procs, args.timeout, "run_debounce_worker")
        result = stamps(r, started, args.jobs)
        for proc in procs:
            if proc.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"run_debounce_worker exited with status {proc.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = Job.objects.filter(task_name=NOOP, status=Job.Status.SUCCESSFUL).count()
    if done != args.jobs:
        raise SystemExit(f"run_debounce_worker: {done} of {args.jobs} jobs SUCCESSFUL")
    return result


def drain_celery(args: argparse.Namespace, processes: int, concurrency: int) -> tuple[float, float]:
    """Publish ``--jobs`` no-op tasks, drain them with ``processes`` Celery workers; return jobs/s."""
    from bench.peersapp.celery_bench import noop

    r = redis_client(args.redis)
    r.flushdb()
    for n in range(args.jobs):
        noop.delay(n)
    log = tempfile.TemporaryFile()
    started = time.time()
    procs = [
        subprocess.Popen(
            [*celery_worker_cmd(concurrency, args.celery_pool), f"--hostname=drain{i}@%h"],
            cwd=ROOT,
            env=worker_env(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(processes)
    ]
    try:
        wait_all(r, procs, args.timeout, "celery worker")
        return stamps(r, started, args.jobs)
    except SystemExit:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def run(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    """Race every scenario; return the table's rows and the raw figures."""
    rows: list[list[str]] = []
    raw: dict[str, Any] = {}
    for label, processes, concurrency in SCENARIOS:
        celery: list[tuple[float, float]] = []
        ours: dict[str, list[tuple[float, float]]] = {p: [] for p in args.prefetch}
        for round_no in range(args.rounds):
            sides = ["celery", *args.prefetch]
            if round_no % 2:
                sides.reverse()
            for side in sides:
                if side == "celery":
                    figures = drain_celery(args, processes, concurrency)
                    celery.append(figures)
                else:
                    figures = drain_ours(args, processes, concurrency, side)
                    ours[side].append(figures)
                print(
                    f"{label} round {round_no + 1} {side}: {figures[0]:.0f} jobs/s whole, "
                    f"{figures[1]:.0f} steady",
                    file=sys.stderr,
                    flush=True,
                )
        raw[label] = {"celery": celery, **{f"ours prefetch={p}": v for p, v in ours.items()}}
        for prefetch, figures in ours.items():
            for i, span in enumerate(("whole", "steady")):
                ratios = [o[i] / c[i] for o, c in zip(figures, celery, strict=True)]
                rows.append(
                    [
                        label,
                        prefetch,
                        span,
                        f"{statistics.median(o[i] for o in figures):.0f} "
                        f"[{min(o[i] for o in figures):.0f}–{max(o[i] for o in figures):.0f}]",
                        f"{statistics.median(c[i] for c in celery):.0f} "
                        f"[{min(c[i] for c in celery):.0f}–{max(c[i] for c in celery):.0f}]",
                        f"{statistics.median(ratios):.2f}",
                    ]
                )
    return rows, raw


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="no-op jobs per drain")
    parser.add_argument("--rounds", type=int, default=3, help="drains per side and scenario")
    parser.add_argument(
        "--prefetch",
        nargs="+",
        default=["default"],
        help="our DEBOUNCE_PREFETCH values to race (default: the setting's default)",
    )
    parser.add_argument("--smoke", action="store_true", help="300 jobs, 1 round (CI)")
    parser.add_argument(
        "--sleep-ms", type=float, default=0.0, help="each job sleeps this long (both sides)"
    )
    parser.add_argument("--celery-pool", choices=["prefork", "threads"], default="prefork")
    parser.add_argument("--conn-max-age", default=None, help="our CONN_MAX_AGE (as peers.py)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9", help="flushed; never 0")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain at most")
    parser.add_argument("--json", metavar="FILE", help="write the raw figures here")
    add_db_arguments(parser, "bench_drain")
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.rounds = 300, 1
    if urlsplit(args.redis).path.strip("/") in {"", "0"}:
        sys.exit("--redis must name a database other than 0 (it is flushed)")
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis
    os.environ["DEBOUNCE_PEERS_JOBS"] = str(args.jobs)
    if args.sleep_ms < 0:
        sys.exit("--sleep-ms must be at least 0")
    os.environ["DEBOUNCE_PEERS_SLEEP_MS"] = str(args.sleep_ms)  # the workers inherit it
    setup(args)
    try:
        rows, raw = run(args)
    finally:
        teardown(args)
        redis_client(args.redis).flushdb()
    print()
    print(
        f"drain: {args.jobs:,} due "
        + (f"{args.sleep_ms:g} ms sleeping" if args.sleep_ms else "no-op")
        + f" jobs per run, {args.rounds} round(s); jobs/s median "
        "[min–max]; ratio = ours / Celery on Redis of the same round (median)"
    )
    print()
    print(
        table(
            ["scenario", "prefetch", "span", "ours jobs/s", "celery jobs/s", "ours / celery"], rows
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "figures": raw}, indent=2))


if __name__ == "__main__":
    main()
