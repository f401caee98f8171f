# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: a worker process's peak RSS after 10,000 and after 100,000 jobs (issue #12).

    python3 dev.py bench rss                     # 100,000 jobs, marks at 10k and 100k
    python3 dev.py bench rss -- --smoke          # 300 jobs, marks at 100 and 300
    .venv/bin/python bench/rss.py --jobs 20000 --marks 2000 20000 --json out.json

PostgreSQL and Redis, as ``bench/peers.py`` (whose helpers and no-op task this
reuses). Fills the job table with ``--jobs`` due no-op jobs (one ``INSERT …
SELECT``) and drains them with one ``run_debounce_worker --burst --concurrency C``
process (``--concurrency``, default 1: inline). Every no-op bumps a Redis counter;
when it passes a mark of ``--marks`` the benchmark reads the worker's ``VmHWM``
(peak resident set size) from ``/proc/PID/status``; at exit it also takes the
kernel's ``ru_maxrss`` from ``os.wait4`` (the same peak, exact). One process runs
all marks, so a leak shows as growth between them: the target is peak RSS at
100k ≤ 1.1 × at 10k. Memory does not depend much on the machine's load, so one
run (``--rounds 1``) is the default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, add_db_arguments, setup, table, teardown  # noqa: E402
from bench.peers import fill_jobs, our_worker_cmd, redis_client, worker_env  # noqa: E402


def vm_hwm_kib(pid: int) -> int | None:
    """Return the process's peak RSS (``VmHWM``) in KiB, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.peersapp import counter

    fill_jobs(args.jobs)
    r = redis_client(args.redis)
    r.flushdb()
    proc = subprocess.Popen(
        [sys.executable, *our_worker_cmd(args.concurrency)], cwd=ROOT, env=worker_env(args)
    )
    marks = sorted(args.marks)
    at: dict[str, int] = {}
    started = time.monotonic()
    exited: tuple[int, Any] | None = None
    try:
        while exited is None:
            done = int(r.get(counter.COUNT) or 0)
            while marks and done >= marks[0]:
                hwm = vm_hwm_kib(proc.pid)
                if hwm is not None:
                    at[str(marks[0])] = hwm
                marks.pop(0)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # reaped here, not by Popen
            if pid:
                exited = (os.waitstatus_to_exitcode(status), usage)
            elif time.monotonic() - started > args.timeout:
                raise SystemExit(f"the worker did not finish within {args.timeout:.0f} s")
            else:
                time.sleep(0.05)
    finally:
        if exited is None:
            proc.kill()
            proc.wait()
    proc.returncode, usage = exited
    for mark in marks:  # passed while the process was exiting: its whole-life peak
        at[str(mark)] = usage.ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"run_debounce_worker exited with status {proc.returncode}")
    done = int(r.get(counter.COUNT) or 0)
    if done != args.jobs:
        raise SystemExit(f"the worker ran {done} of {args.jobs} jobs")
    return {"vmhwm_kib_at": at, "ru_maxrss_kib": usage.ru_maxrss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--marks", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/8", help="flushed; never 0")
    parser.add_argument("--conn-max-age", default=None, help="our CONN_MAX_AGE (as peers.py)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds at most")
    parser.add_argument("--smoke", action="store_true", help="300 jobs, marks 100 and 300")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(parser, "bench_rss")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.marks, args.rounds = 300, [100, 300], 1
    if max(args.marks) > args.jobs:
        sys.exit("--marks must not exceed --jobs")
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis  # before bench.peersapp.counter is imported
    os.environ["DEBOUNCE_PEERS_JOBS"] = str(args.jobs)
    setup(args)
    runs = []
    try:
        for round_no in range(args.rounds):
            runs.append(one_run(args))
            print(f"rss round {round_no + 1}: {runs[-1]}", file=sys.stderr, flush=True)
    finally:
        teardown(args)
        redis_client(args.redis).flushdb()
    marks = [str(m) for m in sorted(args.marks)]
    rows = [
        [
            f"{int(m):,} jobs",
            ", ".join(f"{run['vmhwm_kib_at'].get(m, 0) / 1024:.1f}" for run in runs),
            f"{runs[0]['vmhwm_kib_at'].get(m, 0) / runs[0]['vmhwm_kib_at'].get(marks[0], 1):.3f}",
        ]
        for m in marks
    ]
    print(table(["after", "peak RSS MiB (VmHWM), per round", "ratio to first mark"], rows))
    print(f"ru_maxrss at exit: {', '.join(str(r['ru_maxrss_kib'] // 1024) for r in runs)} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
