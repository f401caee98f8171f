# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: draining no-op jobs with the Celery executor beside the built-in worker (issue #10).

    python3 dev.py bench celery_drain                       # 2,000 jobs, C = 1 and 4
    python3 dev.py bench celery_drain -- --jobs 5000 --concurrency 4 --rounds 3
    python3 dev.py bench celery_drain -- --concurrency 1 --rounds 3 --sides celery executor \
        --before /tmp/before          # a `git archive` of an older commit, raced in the same run

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

* ``celery``: plain Celery on the same Redis, no database (``bench.peers.drain_celery``:
  ``--jobs`` no-op Celery tasks published, then drained by ``celery worker``, ``solo``
  at C = 1);
* ``executor@before`` (with ``--before DIR``): the Celery executor's two processes run
  from ``DIR``, a tree of another commit (``git archive <commit> | tar -x -C DIR``), so a
  change is measured against what it replaced in one run, rounds interleaved.

``--sides`` picks the sides (default: ``worker`` and ``executor``). Both no-ops do one Redis ``INCR`` (``bench/peersapp/counter.py``); the first
and the last job stamp the time, so the same instrument times both sides.
Prints jobs/s ``whole`` (from starting the processes to the last job,
start-up included) and ``steady`` (first job to last), medians over
``--rounds``, each side's median per-round ratio of steady jobs/s to plain Celery's (when
``celery`` runs), and for the executor the committed transactions and new database
sessions per job (``pg_stat_database``, both processes together, the dispatcher's claims
included); and checks every job ended SUCCESSFUL, run once. ``--profile DIR`` runs each
executor side's Celery worker under ``cProfile`` (``DIR/<side>-C<C>-<round>.prof``).

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


def drain_celery(args: argparse.Namespace, concurrency: int) -> tuple[float, float]:
    """Drain ``--jobs`` plain Celery no-op tasks on the same Redis; return (whole, steady) jobs/s."""
    whole, steady, _ = peers.drain_celery(args, concurrency)
    return whole, steady


def drain_executor(
    args: argparse.Namespace, concurrency: int, root: Path = ROOT, label: str = "executor"
) -> tuple[float, float, float, float]:
    """Drain with the Celery executor (scheduler + Celery worker) run from the tree ``root``.

    Returns (whole, steady) jobs/s and the committed transactions and new database sessions
    per job of both processes (``pg_stat_database``, read after they exited).
    """
    from django_debounce.models import Job

    peers.fill_jobs(args.jobs)
    r = peers.redis_client(args.redis)
    r.flushdb()
    time.sleep(1.1)  # let this backend's own statistics flush (at most once a second)
    before = peers.database_counters()
    env = peers.worker_env(args)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env["PYTHONPATH"]])
    env["DJANGO_SETTINGS_MODULE"] = "bench.peersapp.settings_celery"
    if args.db_reuse_max is not None:
        env["DEBOUNCE_BENCH_DB_REUSE_MAX"] = str(args.db_reuse_max)
    pool = "solo" if concurrency == 1 else "prefork"
    logs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    profile: list[str] = []
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        args.profile_runs = getattr(args, "profile_runs", 0) + 1
        out = args.profile / f"{label}-C{concurrency}-{args.profile_runs}.prof"
        profile = ["-m", "cProfile", "-o", str(out)]
    started = time.time()
    worker = subprocess.Popen(
        [
            sys.executable,
            *profile,
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
        cwd=root,
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
        cwd=root,
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
    after = peers.database_counters()
    return (
        whole,
        steady,
        (after[0] - before[0]) / args.jobs,
        (after[1] - before[1]) / args.jobs,
    )


def race(args: argparse.Namespace) -> list[str]:
    """Drain with every side at each concurrency, rounds interleaved; return the report's lines."""
    sides = list(args.sides) + (["executor@before"] if args.before else [])
    lines = [
        f"drain of {args.jobs} no-op jobs (PostgreSQL, Redis broker), median [min-max] of "
        f"{args.rounds} round(s); ratio: steady jobs/s over plain Celery's in the same round",
        f"{'side':<18} {'C':>2} {'whole jobs/s':>13} {'steady jobs/s':>20} {'/ celery':>8} "
        f"{'xact/job':>8} {'sessions/job':>12}",
    ]
    for concurrency in args.concurrency:
        results: dict[str, list[tuple[float, ...]]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            order = sides[round_ % len(sides) :] + sides[: round_ % len(sides)]
            for side in order if round_ % 2 == 0 else order[::-1]:
                if side == "worker":
                    figures: tuple[float, ...] = drain_worker(args, concurrency)
                elif side == "celery":
                    figures = drain_celery(args, concurrency)
                elif side == "executor":
                    figures = drain_executor(args, concurrency)
                else:
                    figures = drain_executor(args, concurrency, args.before, "before")
                results[side].append(figures)
                print(
                    f"C={concurrency} round {round_ + 1} {side}: "
                    + ", ".join(f"{value:.2f}" for value in figures),
                    file=sys.stderr,
                    flush=True,
                )
        for side, figures in results.items():
            whole = statistics.median(f[0] for f in figures)
            steadies = [f[1] for f in figures]
            spread = f"{statistics.median(steadies):.0f} [{min(steadies):.0f}-{max(steadies):.0f}]"
            ratio = "-"
            if "celery" in results and side != "celery":
                ratio = "{:.2f}".format(
                    statistics.median(
                        f[1] / c[1] for f, c in zip(figures, results["celery"], strict=True)
                    )
                )
            xact = f"{statistics.median(f[2] for f in figures):.2f}" if len(figures[0]) > 2 else "-"
            sess = f"{statistics.median(f[3] for f in figures):.3f}" if len(figures[0]) > 3 else "-"
            lines.append(
                f"{side:<18} {concurrency:>2} {whole:>13.0f} {spread:>20} {ratio:>8} "
                f"{xact:>8} {sess:>12}"
            )
    return lines


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
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=["worker", "celery", "executor"],
        default=["worker", "executor"],
        help="what drains: the built-in worker, plain Celery, the Celery executor",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="also race the Celery executor run from this tree (another commit's checkout)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the Celery workers")
    add_db_arguments(parser, "bench_celery_drain")
    args = parser.parse_args()
    args.celery_pool = "prefork"  # bench.peers.drain_celery's pool above C = 1
    if args.redis.rstrip("/").endswith("/0"):
        sys.exit("refusing to flush Redis database 0: give --redis another database")
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis
    setup(args)
    try:
        print("\n".join(race(args)))
    finally:
        teardown(args)


if __name__ == "__main__":
    main()
