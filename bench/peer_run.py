# ruff: noqa: T201  (a benchmark prints its figures)
"""Peer scenarios of issue #12, run inside ``bench/.venv-peers`` (``bench/peers_env.py``).

    bench/.venv-peers/bin/python bench/peer_run.py --peer procrastinate --jobs 5000
    bench/.venv-peers/bin/python bench/peer_run.py --peer djtasks --only latency --samples 50

Prints one JSON object on its last line (the suite, ``bench/suite.py``, reads
it). For ``--peer`` (``djtasks``: django-tasks-db; ``procrastinate``;
``celery``: Celery solo on Redis), each ``--rounds`` times:

* ``enqueue``: ``--jobs`` plain enqueues of the no-op, one call and one commit each
  (django-tasks-db ``noop.enqueue(n)``, procrastinate ``noop.defer(n=n)``, Celery
  ``noop.delay(n)``) → calls/s;
* ``drain``: those ``--jobs`` due no-op jobs drained by one worker process at
  concurrency 1, started as a subprocess once they are all enqueued: ``manage.py
  db_worker --batch --no-startup-delay`` (exits when the queue is empty);
  procrastinate's ``App.run_worker(wait=False, concurrency=1)`` (the same);
  ``celery worker --pool=solo`` (stopped with SIGTERM afterwards). Every no-op does
  one Redis ``INCR`` (``bench/peersapp/counter.py``, as ours): jobs/s ``whole`` =
  from starting the worker process to the last job, ``steady`` = first job to last;
* ``latency``: one long-running worker process, idle; ``--samples`` times, after a
  random pause (as ``bench/latency.py``: 50 ms plus up to one poll interval for
  django-tasks-db, so the job lands anywhere in its poll cycle; 50–150 ms for the
  others, which do not poll), a ``stamp`` job is enqueued and its first line pushes
  its start time to Redis: enqueue→start in ms (p50, p95, p99, max).
  django-tasks-db polls (``db_worker --interval --poll``, default 1 s, its
  default); procrastinate listens (LISTEN/NOTIFY, its default); Celery's solo
  worker reads Redis (BRPOP).

Each peer has a PostgreSQL database of its own (``--url``, default
``bench_peer_<peer>``, created and dropped) and a Redis database of its own
(``--redis``, default 5/6/7 for djtasks/procrastinate/celery; flushed, never 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEERS = ("djtasks", "procrastinate", "celery")
REDIS_DB = {"djtasks": 5, "procrastinate": 6, "celery": 7}
DJANGO_SETTINGS = "bench.peerapps.djtasks_settings"


def env_for(args: argparse.Namespace, jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DEBOUNCE_PEER_URL=args.url,
        DEBOUNCE_PEERS_REDIS=args.redis,
        DEBOUNCE_PEERS_JOBS=str(jobs),
        DJANGO_SETTINGS_MODULE=DJANGO_SETTINGS,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return env


def admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True)


def create_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    if not name.startswith("bench_"):
        sys.exit(f"refusing to (re)create database {name!r}: its name must start with bench_")
    with admin(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    with admin(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{urlsplit(url).path.lstrip("/")}" WITH (FORCE)')


class Peer:
    """One peer: how to set it up, empty it, enqueue, and start its worker."""

    name = ""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def setup(self) -> None: ...

    def empty(self) -> None: ...

    def enqueue_noop(self, n: int) -> None:
        raise NotImplementedError

    def enqueue_stamp(self, tag: str) -> None:
        raise NotImplementedError

    def worker_cmd(self, burst: bool) -> list[str]:
        raise NotImplementedError

    def close(self) -> None: ...


class DjangoTasksDB(Peer):
    name = "djtasks"

    def setup(self) -> None:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)

    def empty(self) -> None:
        from django_tasks_db.models import DBTaskResult

        DBTaskResult.objects.all().delete()

    def enqueue_noop(self, n: int) -> None:
        from bench.peerapps.djtasks_tasks import noop

        noop.enqueue(n)

    def enqueue_stamp(self, tag: str) -> None:
        from bench.peerapps.djtasks_tasks import stamp

        stamp.enqueue(tag)

    def worker_cmd(self, burst: bool) -> list[str]:
        cmd = [sys.executable, "-m", "django", "db_worker", "--no-startup-delay", "-v", "0"]
        if burst:
            return [*cmd, "--batch"]
        return [*cmd, "--interval", repr(self.args.poll)]

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class Procrastinate(Peer):
    name = "procrastinate"

    def setup(self) -> None:
        from bench.peerapps.procrastinate_app import app

        self.app = app
        self.opened = app.open()
        self.app.schema_manager.apply_schema()

    def empty(self) -> None:
        connector = self.app.connector.get_sync_connector()
        connector.execute_query("TRUNCATE procrastinate_jobs CASCADE")

    def enqueue_noop(self, n: int) -> None:
        from bench.peerapps.procrastinate_app import noop

        noop.defer(n=n)

    def enqueue_stamp(self, tag: str) -> None:
        from bench.peerapps.procrastinate_app import stamp

        stamp.defer(tag=tag)

    def worker_cmd(self, burst: bool) -> list[str]:
        code = (
            "from bench.peerapps.procrastinate_app import app; "
            f"app.run_worker(queues=['default'], concurrency=1, wait={not burst})"
        )
        return [sys.executable, "-c", code]

    def close(self) -> None:
        self.app.close()


class CeleryRedis(Peer):
    name = "celery"

    def empty(self) -> None:
        pass  # the Redis database is flushed before each run

    def enqueue_noop(self, n: int) -> None:
        from bench.peerapps.celery_app import noop

        noop.delay(n)

    def enqueue_stamp(self, tag: str) -> None:
        from bench.peerapps.celery_app import stamp

        stamp.delay(tag)

    def worker_cmd(self, burst: bool) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "--quiet",
            "-A",
            "bench.peerapps.celery_app",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
            "--queues=peer",
        ]


def redis(args: argparse.Namespace) -> Any:
    import redis as redis_py

    return redis_py.Redis.from_url(args.redis)


def start(peer: Peer, burst: bool, jobs: int, log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        peer.worker_cmd(burst),
        cwd=ROOT,
        env=env_for(peer.args, jobs),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as one
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def failed(log: Any, message: str) -> SystemExit:
    log.seek(0)
    print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
    return SystemExit(message)


def enqueue_and_drain(peer: Peer) -> dict[str, float]:
    """Enqueue ``--jobs`` no-ops (timed), then drain them with one worker process."""
    from bench.peersapp import counter

    args = peer.args
    r = redis(args)
    r.flushdb()
    peer.empty()
    for n in range(20):  # warm-up: connections, prepared paths (not timed, not drained)
        peer.enqueue_noop(-n)
    peer.empty()
    r.flushdb()
    began = time.perf_counter()
    for n in range(args.jobs):
        peer.enqueue_noop(n)
    enqueue_rate = args.jobs / (time.perf_counter() - began)
    log = tempfile.TemporaryFile()
    started = time.time()
    proc = start(peer, True, args.jobs, log)
    try:
        deadline = time.monotonic() + args.timeout
        while not r.blpop([counter.DONE], timeout=1):
            if proc.poll() is not None:
                raise failed(log, f"{peer.name} worker exited ({proc.returncode}) before the end")
            if time.monotonic() > deadline:
                raise failed(log, f"{peer.name}: not drained after {args.timeout:.0f} s")
        first, last = float(r.get(counter.FIRST)), float(r.get(counter.LAST))
    finally:
        stop(proc)
        log.close()
    return {
        "enqueue_per_s": enqueue_rate,
        "drain_whole_per_s": args.jobs / (last - started),
        "drain_steady_per_s": (args.jobs - 1) / (last - first),
    }


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def latency(peer: Peer) -> dict[str, Any]:
    """Idle enqueue→start latency of ``--samples`` jobs, one at a time, worker idle between."""
    args = peer.args
    r = redis(args)
    r.flushdb()
    peer.empty()
    log = tempfile.TemporaryFile()
    proc = start(peer, False, 10**9, log)
    rng = random.Random(12)
    samples: list[float] = []

    def one(tag: str, timeout: float) -> float:
        sent = time.time()
        peer.enqueue_stamp(tag)
        got = r.blpop([f"lat:{tag}"], timeout=timeout)
        if not got:
            raise failed(log, f"{peer.name}: job {tag} did not start within {timeout:.0f} s")
        return (float(got[1]) - sent) * 1000

    try:
        one("warm-up", 60)  # the worker is up and has run one job
        # As bench/latency.py: the job lands at a random point of a polling worker's cycle
        # (a job's end wakes it, then it sleeps a whole interval); 50-150 ms for the others.
        cycle = args.poll if peer.name == "djtasks" else 0.1
        for i in range(args.samples):
            time.sleep(0.05 + rng.uniform(0, cycle))
            samples.append(one(str(i), 30))
            if proc.poll() is not None:
                raise failed(log, f"{peer.name} worker exited ({proc.returncode})")
    finally:
        stop(proc)
        log.close()
    return {
        "latency_p50_ms": statistics.median(samples),
        "latency_p95_ms": percentile(samples, 95),
        "latency_p99_ms": percentile(samples, 99),
        "latency_max_ms": max(samples),
        "latency_samples_ms": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--only", choices=["drain", "latency"], help="one part (drain: + enqueue)")
    parser.add_argument("--jobs", type=int, default=5_000, help="enqueues and drained jobs")
    parser.add_argument("--samples", type=int, default=200, help="latency samples per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--poll", type=float, default=1.0, help="db_worker --interval (latency)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per drain at most")
    parser.add_argument("--url", help="PostgreSQL database (created and dropped)")
    parser.add_argument("--redis", help="Redis database (flushed; never 0)")
    parser.add_argument("--smoke", action="store_true", help="100 jobs, 5 samples, 1 round (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.samples, args.rounds = 100, 5, 1
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    args.url = args.url or urlunsplit(urlsplit(base)._replace(path=f"/bench_peer_{args.peer}"))
    args.redis = args.redis or f"redis://127.0.0.1:6379/{REDIS_DB[args.peer]}"
    if urlsplit(args.redis).path.strip("/") in {"", "0"}:
        sys.exit("--redis must name a database other than 0 (it is flushed)")
    # Read by bench.peersapp.counter and the peer modules at import: set before any import.
    os.environ.update(env_for(args, args.jobs))
    create_database(args.url)
    peer: Peer = {"djtasks": DjangoTasksDB, "procrastinate": Procrastinate, "celery": CeleryRedis}[
        args.peer
    ](args)
    rounds: list[dict[str, Any]] = []
    try:
        peer.setup()
        for round_no in range(args.rounds):
            figures: dict[str, Any] = {}
            parts: list[Callable[[Peer], dict[str, Any]]] = []
            if args.only in (None, "drain"):
                parts.append(enqueue_and_drain)
            if args.only in (None, "latency"):
                parts.append(latency)
            for part in parts:
                figures.update(part(peer))
            rounds.append(figures)
            shown = {k: round(v, 1) for k, v in figures.items() if isinstance(v, float)}
            print(f"{args.peer} round {round_no + 1}: {shown}", file=sys.stderr, flush=True)
    finally:
        peer.close()
        redis(args).flushdb()
        drop_database(args.url)
    print(json.dumps({"peer": args.peer, "args": vars(args), "rounds": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
