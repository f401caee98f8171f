# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: draining no-op jobs with the Celery executor beside the built-in worker (issue #10).

    python3 dev.py bench celery_drain                       # 2,000 jobs, C = 1 and 4
    python3 dev.py bench celery_drain -- --jobs 5000 --concurrency 4 --rounds 3

PostgreSQL (its own database, created and dropped: bench/common.py) and the
local Redis (``--redis``, default database 14, flushed; never 0; not 9, which
``bench/peers.py`` and other benchmarks flush). Each round
fills the job table with ``--jobs`` due no-op jobs (``bench.peers.noop``, one
``INSERT … SELECT``) and drains them with, in an order that alternates:

* ``worker``: ``run_debounce_worker --burst --concurrency C`` (one process, C threads);
* ``celery executor``: ``run_debounce_worker --dispatch-only --burst`` (the
  scheduler: claims 100 at a time for a hand-off and publishes each job to
  Celery after the claim commits) together with ``celery -A
  bench.peersapp.celery_executor_app worker`` (``--pool=solo`` at C = 1,
  ``prefork`` above), which takes each job by id in one statement, runs it and
  records its outcome.

Both no-ops do one Redis ``INCR`` (``bench/peersapp/counter.py``); the first
and the last job stamp the time, so the same instrument times both sides.
Prints jobs/s ``whole`` (from starting the processes to the last job,
start-up included) and ``steady`` (first job to last), medians over
``--rounds``, and checks every job ended SUCCESSFUL, run once.

Celery's Django fixup closes every database connection before and after each
task unless ``CELERY_DB_REUSE_MAX`` is set: ``--db-reuse-max N`` sets it on the
Celery worker (``--conn-max-age`` sets ``CONN_MAX_AGE`` on both sides).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers  # noqa: E402
from bench.common import ROOT, add_db_arguments, setup, teardown  # noqa: E402


def drain_worker(args: argparse.Namespace, concurrency: int) -> tuple[float, float]:
    """Drain with the built-in worker; return (whole, steady) jobs/s."""
    whole, steady, _, _ = peers.drain_ours(args, concurrency)
    return whole, steady


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def drain_executor(args: argparse.Namespace, concurrency: int) -> tuple[float, float]:
    """Drain with the Celery executor (scheduler + Celery worker); return (whole, steady) jobs/s."""
    from django_debounce.models import Job

    peers.fill_jobs(args.jobs)
    r = peers.redis_client(args.redis)
    r.flushdb()
    env = peers.worker_env(args)
    env["DJANGO_SETTINGS_MODULE"] = "bench.peersapp.settings_celery"
    if args.db_reuse_max is not None:
        env["DEBOUNCE_BENCH_DB_REUSE_MAX"] = str(args.db_reuse_max)
    pool = "solo" if concurrency == 1 else "prefork"
    logs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    started = time.time()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "--quiet",
            "-A",
            "bench.peersapp.celery_executor_app",
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
            "--queues=executor-bench",
        ],
        cwd=ROOT,
        env=env,
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "run_debounce_worker",
            "--dispatch-only",
            "--burst",
            "-v",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=logs[1],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        peers.wait_done(r, worker, args.timeout, "celery worker (Celery executor)")
        whole, steady = peers.stamps(r, started, args.jobs)
        if scheduler.wait(timeout=args.timeout) != 0:
            raise SystemExit(f"the scheduler exited with status {scheduler.returncode}")
    except SystemExit:
        for log in logs:
            log.seek(0)
            print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        _stop(scheduler)
        _stop(worker)
        for log in logs:
            log.close()
    done = Job.objects.filter(task_name=peers.NOOP, status=Job.Status.SUCCESSFUL, attempts=1)
    if done.count() != args.jobs:
        from django.db.models import Count

        states = list(Job.objects.values_list("status", "attempts").annotate(n=Count("id")))
        raise SystemExit(
            f"Celery executor: {done.count()} of {args.jobs} jobs SUCCESSFUL once: {states}"
        )
    runs = int(r.get("peers:count") or 0)
    if runs != args.jobs:
        raise SystemExit(f"Celery executor: {runs} runs for {args.jobs} jobs")
    return whole, steady


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2_000, help="no-op jobs per drain")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=1, help="drains per side and concurrency")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="flushed; never 0")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--conn-max-age",
        default=None,
        help="CONN_MAX_AGE of both sides' processes (seconds or None; default: bench.settings' 0)",
    )
    parser.add_argument(
        "--db-reuse-max",
        type=int,
        default=None,
        help="Celery's CELERY_DB_REUSE_MAX for the Celery worker (default: unset, so Celery's "
        "Django fixup closes the database connection before and after every task)",
    )
    add_db_arguments(parser, "bench_celery_drain")
    args = parser.parse_args()
    if args.redis.rstrip("/").endswith("/0"):
        sys.exit("refusing to flush Redis database 0: give --redis another database")
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis
    setup(args)
    try:
        lines = [
            f"drain of {args.jobs} no-op jobs (PostgreSQL, Redis broker), median of "
            f"{args.rounds} round(s)",
            f"{'side':<32} {'C':>2} {'whole jobs/s':>13} {'steady jobs/s':>14}",
        ]
        for concurrency in args.concurrency:
            results: dict[str, list[tuple[float, float]]] = {"worker": [], "celery executor": []}
            for round_ in range(args.rounds):
                order = ["worker", "celery executor"]
                for side in order if round_ % 2 == 0 else order[::-1]:
                    run = drain_worker if side == "worker" else drain_executor
                    results[side].append(run(args, concurrency))
            for side, figures in results.items():
                whole = statistics.median(f[0] for f in figures)
                steady = statistics.median(f[1] for f in figures)
                lines.append(f"{side:<32} {concurrency:>2} {whole:>13.0f} {steady:>14.0f}")
        print("\n".join(lines))
    finally:
        teardown(args)


if __name__ == "__main__":
    main()
