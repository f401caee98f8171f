# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: scaling out to 1, 2 and 4 worker processes, and where PostgreSQL is the ceiling (issue #23).

    python3 dev.py bench scale_out                 # 2,000 jobs per drain, Redis and RabbitMQ
    python3 dev.py bench scale_out -- --quick      # 300 jobs, the same table in ~3 minutes
    python3 dev.py bench scale_out -- --brokers redis --processes 1 4 --rounds 3

Each drain fills the job table with ``--jobs`` due no-op jobs (``bench.peers.noop``, one
``INSERT … SELECT``) or publishes as many plain Celery tasks, then starts the drainers and
times them with the Redis counter every no-op bumps (``bench/peersapp/counter.py``):

* ``built-in``: N ``run_debounce_worker --burst`` processes (concurrency 1 each); no broker;
* ``plain celery``: Celery alone on the broker, no database: ``solo`` is N ``celery worker
  --pool=solo`` processes, ``prefork`` one ``celery worker --pool=prefork -c N``;
* ``executor``: D ``run_debounce_worker --dispatch-only --burst`` dispatchers (``--dispatchers``)
  handing the jobs to the same N Celery worker processes (solo or prefork).

Brokers (``--brokers``): the local Redis (``--redis``, flushed; never database 0) and RabbitMQ
(``--amqp``; the bench's queues are purged before each drain). Per row: steady jobs/s (first job
to last) and whole (from starting the processes), the ratio to plain Celery with the same
broker, pool and process count in the same round, the scaling ratio to the same drainer at one
process, and where the CPU went during the drain, each over the drain's wall time (1.0 = one
core busy): ``pg cores``, the PostgreSQL backends serving the bench's database
(``/proc/PID/stat`` of the pids ``pg_stat_activity`` lists, sampled every 0.05 s: a backend
that lives less misses its share); ``drain cores``, the drain's own processes and their
children, start-up included (``getrusage(RUSAGE_CHILDREN)``); ``busy cores``, the whole
machine (``/proc/stat``: other users of a shared machine too). ``xact/job`` is the committed
transactions per job (``pg_stat_database``), ``xact/s`` those per second at the steady rate.
On a 2-core machine 4 processes share the cores with PostgreSQL: the columns show whether
the database, the drainers or the machine sets the rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, add_db_arguments, setup, table, teardown  # noqa: E402
from bench.drain import wait_all  # noqa: E402
from bench.peers import (  # noqa: E402
    NOOP,
    celery_worker_cmd,
    database_counters,
    fill_jobs,
    our_worker_cmd,
    redis_client,
    stamps,
    worker_env,
)

TICKS = os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Sum the CPU time of this database's PostgreSQL backends and of the machine, in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = urlsplit(url).path.lstrip("/")
        self.base: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _ticks(pid: int) -> int | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return int(fields[11]) + int(fields[12])  # utime + stime

    @staticmethod
    def _machine() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)

    def _sample(self, cursor: Any, first: bool) -> None:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.database])
        for (pid,) in cursor.fetchall():
            ticks = self._ticks(pid)
            if ticks is None:
                continue
            if pid not in self.base:  # seen before the drain: its past is not ours
                self.base[pid] = ticks if first else 0
            self.last[pid] = ticks

    def _run(self) -> None:
        import psycopg

        admin = self.url.rsplit("/", 1)[0] + "/postgres"  # not counted among ours
        with psycopg.connect(admin, autocommit=True) as conn, conn.cursor() as cursor:
            self._sample(cursor, first=True)
            self._ready.set()
            while not self._stop.wait(0.05):
                self._sample(cursor, first=False)
            self._sample(cursor, first=False)

    def __enter__(self) -> CpuSampler:
        self._ready = threading.Event()
        self._children = _children_cpu()
        self._machine_before = self._machine()
        self._started = time.monotonic()
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        wall = time.monotonic() - self._started
        busy, total = (a - b for a, b in zip(self._machine(), self._machine_before, strict=True))
        pg = sum(self.last[pid] - self.base[pid] for pid in self.last) / TICKS
        self.pg_cores = pg / wall
        self.drain_cores = (_children_cpu() - self._children) / wall
        self.busy_cores = busy / total * (os.cpu_count() or 1) if total else 0.0


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants (the drain's processes, their children)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _celery_procs(
    app: str, queue: str, pool: str, processes: int, env: dict[str, str], log: Any
) -> list[subprocess.Popen[bytes]]:
    """Start N solo Celery workers, or one prefork worker with N children, on ``queue``."""
    shapes = [(1, "solo")] * processes if pool == "solo" else [(processes, "prefork")]
    procs = []
    for i, (concurrency, chosen) in enumerate(shapes):
        cmd = celery_worker_cmd(concurrency, chosen)
        cmd[cmd.index("bench.peersapp.celery_bench")] = app
        cmd[-1] = f"--queues={queue}"
        procs.append(
            subprocess.Popen(
                [*cmd, f"--hostname=scale{i}@%h"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return procs


_apps: dict[str, Any] = {}


def _app(url: str) -> Any:
    """Return this process's Celery app on broker ``url`` (one per broker: a pool each)."""
    if url not in _apps:
        from celery import Celery

        _apps[url] = Celery("scale-out", broker=url, set_as_current=False)
        _apps[url].conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
    return _apps[url]


def _purge(url: str, queue: str) -> None:
    """Empty the bench's Celery queue on the broker (RabbitMQ keeps it across drains)."""
    from kombu import Queue

    with _app(url).connection_for_write() as conn:
        bound = Queue(queue).bind(conn.default_channel)
        bound.declare()
        bound.purge()


def drain(args: argparse.Namespace, side: str, broker: str, pool: str, n: int, d: int) -> dict:
    """Run one drain; return its figures (jobs/s, CPU, transactions)."""
    from django_debounce.models import Job

    r = redis_client(args.redis)
    r.flushdb()
    env = worker_env(args)
    env["DEBOUNCE_BENCH_BROKER"] = args.broker_url.get(broker, "")
    url = args.broker_url.get(broker, "")
    if side == "plain celery":
        _purge(url, "peers")
        for i in range(args.jobs):
            _app(url).send_task("bench.peers.celery_noop", args=[i], queue="peers")
    else:
        fill_jobs(args.jobs)
        if side == "executor":
            _purge(url, "executor-bench")
    log = tempfile.TemporaryFile()
    procs: list[subprocess.Popen[bytes]] = []
    time.sleep(1.1)  # this backend's statistics flush at most once a second
    before = database_counters()
    started = time.time()
    with CpuSampler(args.url) as cpu:
        try:
            if side == "built-in":
                cmd = [sys.executable, *our_worker_cmd(1)]
                procs = [
                    subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                    for _ in range(n)
                ]
            elif side == "plain celery":
                procs = _celery_procs("bench.peersapp.celery_bench", "peers", pool, n, env, log)
            else:
                env["DJANGO_SETTINGS_MODULE"] = "bench.peersapp.settings_celery"
                if args.db_reuse_max is not None:
                    env["DEBOUNCE_BENCH_DB_REUSE_MAX"] = str(args.db_reuse_max)
                app = "bench.peersapp.celery_executor_app"
                procs = _celery_procs(app, "executor-bench", pool, n, env, log)
                dispatch = [sys.executable, "manage.py", "run_debounce_worker"]
                dispatch += ["--dispatch-only", "--burst", "-v", "0"]
                for _ in range(d):
                    procs.append(
                        subprocess.Popen(
                            dispatch, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                        )
                    )
            wait_all(r, procs, args.timeout, side)
            whole, steady = stamps(r, started, args.jobs)
        except SystemExit:
            log.seek(0)
            print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            _stop(procs)
            log.close()
    runs = int(r.get("peers:count") or 0)
    if runs != args.jobs:
        raise SystemExit(f"{side}: {runs} runs for {args.jobs} jobs")
    xact = 0.0
    if side != "plain celery":
        done = Job.objects.filter(task_name=NOOP, status=Job.Status.SUCCESSFUL, attempts=1)
        if done.count() != args.jobs:
            raise SystemExit(f"{side}: {done.count()} of {args.jobs} jobs SUCCESSFUL once")
        xact = (database_counters()[0] - before[0]) / args.jobs
    return {
        "whole": whole,
        "steady": steady,
        "pg": cpu.pg_cores,
        "busy": cpu.busy_cores,
        "drain": cpu.drain_cores,
        "xact": xact,
    }


def scenarios(args: argparse.Namespace) -> list[tuple[str, str, str, int, int]]:
    """Every (side, broker, pool, processes, dispatchers) of this run."""
    found = [("built-in", "-", "-", n, 0) for n in args.processes]
    for broker in args.brokers:
        for pool in args.pools:
            found += [("plain celery", broker, pool, n, 0) for n in args.processes]
            for d in args.dispatchers:
                found += [("executor", broker, pool, n, d) for n in args.processes]
    return found


def run(args: argparse.Namespace) -> list[list[str]]:
    """Drain every scenario ``--rounds`` times (the order reversed every other round)."""
    rows = scenarios(args)
    figures: dict[tuple[str, str, str, int, int], list[dict]] = {row: [] for row in rows}
    for round_no in range(args.rounds):
        for row in rows if round_no % 2 == 0 else rows[::-1]:
            result = drain(args, *row)
            figures[row].append(result)
            print(
                f"round {round_no + 1} {row}: {result['steady']:.0f} jobs/s steady, "
                f"pg {result['pg']:.2f} cores, drain {result['drain']:.2f}, busy {result['busy']:.2f}",
                file=sys.stderr,
                flush=True,
            )
    table_rows = []
    for row in rows:
        side, broker, pool, n, d = row
        steadies = [f["steady"] for f in figures[row]]
        plain = figures.get(("plain celery", broker, pool, n, 0))
        ratio = "-"
        if side == "executor" and plain:
            ratio = "{:.2f}".format(
                statistics.median(
                    f["steady"] / p["steady"] for f, p in zip(figures[row], plain, strict=True)
                )
            )
        one = figures.get((side, broker, pool, min(args.processes), d))
        scaling = "{:.2f}".format(
            statistics.median(
                f["steady"] / o["steady"] for f, o in zip(figures[row], one or [], strict=True)
            )
        )
        table_rows.append(
            [
                side,
                broker,
                pool,
                str(d) if side == "executor" else "-",
                str(n),
                f"{statistics.median(steadies):.0f} [{min(steadies):.0f}–{max(steadies):.0f}]",
                f"{statistics.median(f['whole'] for f in figures[row]):.0f}",
                ratio,
                scaling,
                f"{statistics.median(f['pg'] for f in figures[row]):.2f}",
                f"{statistics.median(f['drain'] for f in figures[row]):.2f}",
                f"{statistics.median(f['busy'] for f in figures[row]):.2f}",
                f"{statistics.median(f['xact'] for f in figures[row]):.2f}"
                if side != "plain celery"
                else "-",
                f"{statistics.median(f['xact'] * f['steady'] for f in figures[row]):.0f}"
                if side != "plain celery"
                else "-",
            ]
        )
    return table_rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2_000, help="no-op jobs per drain")
    parser.add_argument("--rounds", type=int, default=1, help="drains per scenario")
    parser.add_argument("--quick", action="store_true", help="300 jobs, 1 round")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--dispatchers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--pools", nargs="+", choices=["solo", "prefork"], default=["solo", "prefork"]
    )
    parser.add_argument(
        "--brokers", nargs="+", choices=["redis", "rabbitmq"], default=["redis", "rabbitmq"]
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/10", help="flushed; never 0")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain at most")
    parser.add_argument("--conn-max-age", default=None, help="CONN_MAX_AGE of every process")
    parser.add_argument("--db-reuse-max", type=int, default=None, help="CELERY_DB_REUSE_MAX")
    add_db_arguments(parser, "bench_scale_out")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = 300, 1
    if urlsplit(args.redis).path.strip("/") in {"", "0"}:
        sys.exit("--redis must name a database other than 0 (it is flushed)")
    args.broker_url = {"redis": args.redis, "rabbitmq": args.amqp}
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis
    os.environ["DEBOUNCE_PEERS_JOBS"] = str(args.jobs)
    setup(args)
    try:
        rows = run(args)
    finally:
        teardown(args)
        redis_client(args.redis).flushdb()
    print()
    print(
        f"scale-out: {args.jobs:,} due no-op jobs per drain, {args.rounds} round(s), "
        f"{os.cpu_count()} cores, PostgreSQL on this machine; jobs/s steady median [min–max]; "
        "/ plain = over plain Celery with the same broker, pool and processes; "
        f"x 1 = over the same drainer at {min(args.processes)} process(es)"
    )
    print()
    headers = ["drainer", "broker", "pool", "dispatchers", "processes", "jobs/s", "whole"]
    headers += ["/ plain", "x 1", "pg cores", "drain cores", "busy cores", "xact/job", "xact/s"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
