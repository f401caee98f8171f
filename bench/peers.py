# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: django_debounce against raw psycopg (enqueue) and Celery on Redis (drain).

    .venv/bin/python bench/peers.py                       # both parts, defaults (~2-3 min)
    .venv/bin/python bench/peers.py --only enqueue --calls 1000
    .venv/bin/python bench/peers.py --only drain --jobs 2000 --concurrency 1
    .venv/bin/python bench/peers.py --profile .artifacts/peers   # + cProfile of our side

Issue #2's targets: enqueue >= 0.8 x a raw psycopg slide-or-insert, and a
worker draining no-op jobs at least as fast as Celery on Redis. PostgreSQL;
creates and drops its own database (default ``bench_hH_peers``) and flushes
its own Redis database (``--redis``, default ``redis://127.0.0.1:6379/9``;
database 0 is refused).

**enqueue**: ``--calls`` calls per side and round over ``--keys`` keys (a
seeded random sequence, the same for every side, each round on fresh keys:
about ``--keys`` calls open a window, the rest slide one), each call its own
autocommit statement, as a view's would be. Sides, in an order that rotates
every round (``--rounds``):

* ``ours``: ``Task.delay(key)`` of a debounced task (``bench.peers.debounced``,
  window 10 min, max wait 1 h): the real public API, planning, key hash,
  codec, the ``INSERT … ON CONFLICT (window_key) DO UPDATE … RETURNING`` of
  ``django_debounce/upsert.py`` and a ``Job`` built from the returned row.
* ``ours, server-side binding``: the same with the database's ``OPTIONS``
  ``{"server_side_binding": True, "prepare_threshold": 5}`` (Django's opt-in
  for psycopg's server-side parameters and prepared statements).
* ``raw psycopg``: a hand-written psycopg 3 program doing the same atomic
  slide-or-insert on the same table: one ``INSERT … ON CONFLICT (window_key)
  DO UPDATE SET run_at = LEAST(EXCLUDED.run_at, max_run_at), enqueue_count +
  1, last_enqueued_at WHERE <not expired> RETURNING id, enqueue_count`` with
  the same row values, the key hashed the same way (SHA-256), one ``now``
  parameter, psycopg's defaults (server-side binding, prepared after 5 runs).
* ``raw psycopg, client-side binding``: the same through a ``ClientCursor``
  (parameters inlined into the SQL text, never prepared), as Django's
  PostgreSQL backend sends queries: shows how much of the gap is the protocol.

Prints calls/s per side (median over rounds), the ratio ours/raw (median of the
rounds' ratios; target >= 0.8), statements per call of ours (counted with
``CaptureQueriesContext`` over a separate sample), and checks that both sides
wrote the same rows (same columns, same ``enqueue_count`` per key).

**drain**: ``--jobs`` pre-enqueued no-op jobs per run, drained by a real worker
subprocess, for each ``--concurrency`` (default 1 and 4):

* ``ours``: ``manage.py run_debounce_worker --burst --concurrency C
  --settings bench.peersapp.settings`` on jobs inserted with one ``INSERT …
  SELECT`` (plain READY jobs of ``bench.peers.noop``, due now).
* ``celery``: ``celery -A bench.peersapp.celery_bench worker`` on Redis with
  ``--pool=solo`` at C=1 and ``--pool=prefork --concurrency C`` above
  (``--celery-pool`` changes it), tasks published first with ``.delay()``;
  results ignored, early acks, no gossip/mingle/heartbeat/events. Stopped
  with SIGTERM once done.

Both no-ops do one Redis ``INCR`` (``bench/peersapp/counter.py``): the first
job stamps the start, the N-th stamps the end and wakes the benchmark (``BLPOP``,
no polling), so the same instrument times both; it costs one loopback round
trip per job on both sides. Prints jobs/s ``whole`` (from starting the
subprocess to the last job: start-up included) and ``steady`` (first job to
last), the ratios ours/celery (median over ``--drain-rounds``; the side that
goes first alternates; target >= 1.0), and our worker's committed transactions
and new PostgreSQL connections per job (``pg_stat_database``). ``--conn-max-age
None`` gives our worker persistent connections (``bench.settings`` has 0,
Django's default, under which a worker thread reconnects after every job).

``--profile DIR`` adds untimed profiled passes of our side: the enqueue loop
in-process (cProfile), and a ``--concurrency 1`` worker subprocess under
``python -m cProfile -o``; it writes ``DIR/enqueue.prof`` and ``DIR/worker.prof``
and prints where the self time goes (waiting for the database, the psycopg
driver, ORM query building and SQL compilation, our code, logging, …), the
cumulative time of the hot functions and the top functions by self time.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
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
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, add_db_arguments, setup, table, teardown  # noqa: E402

NOOP = "bench.peers.noop"
DEBOUNCED = "bench.peers.debounced"
SETTINGS = "bench.peersapp.settings"

#: Plain READY jobs of the no-op task, due now, in one statement (as bench/claim.py).
FILL = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, worker_id)
SELECT %(task)s, 'default', 0, 'READY', jsonb_build_array(g), '{}'::jsonb,
    now() - interval '1 second', 1, now(), 0, 0, '', '', '{}'::jsonb, '', now(), ''
FROM generate_series(1, %(n)s) g
"""

#: The hand-written slide-or-insert: the row ``upsert.slide_or_insert`` writes for a
#: debounced call (window 600 s, max wait 3600 s), the same conflict target, update and
#: expiry guard; returns only what a caller needs (the id, and whether it opened a window).
RAW = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, opened_at, max_run_at,
    debounce_key, window_key, key_hash, unique_key, unique_lock, enqueue_count,
    last_enqueued_at, attempts, max_retries, result, error, traceback, metadata, notes,
    expires_at, created_at, started_at, finished_at, worker_id, lease_expires_at)
VALUES (
    %(task)s, 'default', 0, 'READY', %(args)s, '{}', %(now)s + interval '600 seconds', %(now)s,
    %(now)s + interval '3600 seconds', %(key)s, %(hash)s, %(hash)s, NULL, NULL, 1,
    %(now)s, 0, %(max_retries)s, NULL, '', '', '{}', '',
    NULL, %(now)s, NULL, NULL, '', NULL)
ON CONFLICT (window_key) DO UPDATE SET
    run_at = LEAST(EXCLUDED.run_at, django_debounce_job.max_run_at),
    enqueue_count = django_debounce_job.enqueue_count + 1,
    last_enqueued_at = EXCLUDED.last_enqueued_at
WHERE django_debounce_job.expires_at IS NULL
    OR django_debounce_job.expires_at > EXCLUDED.last_enqueued_at
RETURNING id, enqueue_count
"""

SIDES = (
    "ours",
    "ours, server-side binding",
    "raw psycopg",
    "raw psycopg, client-side binding",
)
#: Django's OPTIONS for each of our sides: the default (client-side binding, never prepared),
#: and what a project can opt into (psycopg's server-side binding, prepared after 5 runs).
OUR_OPTIONS = {
    "ours": {},
    "ours, server-side binding": {"server_side_binding": True, "prepare_threshold": 5},
}


# -- enqueue ---------------------------------------------------------------------------


def key_sequence(calls: int, keys: int, seed: int) -> list[int]:
    """Return ``calls`` key numbers drawn from ``range(keys)`` (seeded: the same for every side)."""
    rng = random.Random(seed)
    return [rng.randrange(keys) for _ in range(calls)]


def run_ours(prefix: str, sequence: list[int]) -> int:
    """Enqueue ``sequence`` through ``Task.delay``; return how many calls opened a window."""
    from bench.peersapp.tasks import debounced

    opened = 0
    for k in sequence:
        opened += debounced.delay(f"{prefix}{k}").outcome == "created"
    return opened


def run_raw(conn: Any, prefix: str, sequence: list[int], max_retries: int) -> int:
    """Enqueue ``sequence`` with the hand-written statement; return how many opened a window."""
    from datetime import UTC, datetime

    from psycopg.types.json import Jsonb

    opened = 0
    with conn.cursor() as cursor:
        for k in sequence:
            key = f"k:{prefix}{k}"  # the task's key template "k:{0}"
            cursor.execute(
                RAW,
                {
                    "task": DEBOUNCED,
                    "args": Jsonb([f"{prefix}{k}"]),
                    "now": datetime.now(UTC),
                    "key": key,
                    "hash": hashlib.sha256(f"{DEBOUNCED}\x00{key}".encode()).hexdigest(),
                    "max_retries": max_retries,
                },
            )
            opened += cursor.fetchone()[1] == 1
    return opened


def check_same_rows(prefixes: dict[str, str], keys: int) -> None:
    """Fail unless every side wrote the same rows: same columns apart from identity and clock.

    Compares, for each key number, the row of each side: ``enqueue_count`` must match
    (the same calls slid it) and so must every column but the id, the key texts, the
    args (they hold the key) and the timestamps.
    """
    from django.db import connection

    skip = {"id", "debounce_key", "window_key", "key_hash", "args"}
    skip |= {"run_at", "opened_at", "max_run_at", "last_enqueued_at", "created_at"}
    with connection.cursor() as cursor:
        rows: dict[str, dict[str, tuple[Any, ...]]] = {}
        for side, prefix in prefixes.items():
            cursor.execute(
                "SELECT * FROM django_debounce_job WHERE task_name = %s AND debounce_key LIKE %s",
                [DEBOUNCED, f"k:{prefix}%"],
            )
            names = [d[0] for d in cursor.description]
            keep = [i for i, name in enumerate(names) if name not in skip]
            rows[side] = {
                row[names.index("debounce_key")][len(f"k:{prefix}") :]: tuple(row[i] for i in keep)
                for row in cursor.fetchall()
            }
            # The window is exactly 10 minutes past the last call, capped by the ceiling.
            cursor.execute(
                "SELECT count(*) FROM django_debounce_job WHERE debounce_key LIKE %s AND "
                "(max_run_at - opened_at <> interval '1 hour' OR "
                "run_at <> LEAST(last_enqueued_at + interval '10 minutes', max_run_at))",
                [f"k:{prefix}%"],
            )
            bad = cursor.fetchone()[0]
            if bad:
                raise SystemExit(f"{side}: {bad} rows with a wrong run_at/max_run_at")
    first, *others = rows
    for side in others:
        if rows[side] != rows[first]:
            diff = [k for k in rows[first] if rows[first].get(k) != rows[side].get(k)][:3]
            raise SystemExit(f"{side} wrote other rows than {first}, e.g. keys {diff}")
    if len(rows[first]) > keys:
        raise SystemExit(f"{len(rows[first])} rows for {keys} keys")


def enqueue_part(args: argparse.Namespace) -> list[str]:
    """Time the sides of the enqueue race; return the report's lines."""
    import psycopg
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_debounce.conf import settings as debounce_settings

    db = settings.DATABASES["default"]
    dsn = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    raw = psycopg.connect(**dsn, autocommit=True)
    client = psycopg.connect(**dsn, autocommit=True, cursor_factory=psycopg.ClientCursor)
    max_retries = debounce_settings.max_retries
    runners: dict[str, Callable[[str, list[int]], int]] = {
        "ours": run_ours,
        "raw psycopg": lambda prefix, seq: run_raw(raw, prefix, seq, max_retries),
        "raw psycopg, client-side binding": lambda prefix, seq: run_raw(
            client, prefix, seq, max_retries
        ),
    }
    base_options = dict(connection.settings_dict["OPTIONS"])

    def use_options(side: str) -> None:
        """Connect Django with the side's OPTIONS (reconnecting only on a change)."""
        wanted = {**base_options, **OUR_OPTIONS.get(side, {})}
        if connection.settings_dict["OPTIONS"] != wanted:
            connection.close()
            connection.settings_dict["OPTIONS"] = wanted
        connection.ensure_connection()

    runners["ours, server-side binding"] = run_ours
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    opened: dict[str, int] = {}
    try:
        warm = key_sequence(min(args.calls, 300), args.keys, seed=-1)
        for i, side in enumerate(SIDES):  # connection, caches, prepared statements
            use_options(side)
            runners[side](f"w{i}:", warm)
        for round_no in range(args.rounds):
            sequence = key_sequence(args.calls, args.keys, seed=round_no)
            shift = round_no % len(SIDES)
            order = SIDES[shift:] + SIDES[:shift]
            if round_no % 2:
                order = order[::-1]
            for side in order:
                prefix = f"r{round_no}s{SIDES.index(side)}:"
                use_options(side)
                started = time.perf_counter()
                opened[side] = runners[side](prefix, sequence)
                rates[side].append(args.calls / (time.perf_counter() - started))
            print(
                f"round {round_no + 1}: "
                + ", ".join(f"{side} {rates[side][-1]:.0f}/s" for side in SIDES),
                file=sys.stderr,
                flush=True,
            )
            if len(set(opened.values())) != 1:
                raise SystemExit(f"the sides opened different numbers of windows: {opened}")
        check_same_rows(
            {side: f"r{args.rounds - 1}s{i}:" for i, side in enumerate(SIDES)}, args.keys
        )
        # Statements per call of ours: a separate sample (half open a window, half slide).
        sample = [k for k in range(50) for _ in range(2)]
        use_options("ours")
        with CaptureQueriesContext(connection) as captured:
            run_ours("count:", sample)
        statements = len(captured.captured_queries) / len(sample)
        with raw.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM django_debounce_job")
            rows_in_table = cursor.fetchone()[0]  # type: ignore[index]
    finally:
        raw.close()
        client.close()
        connection.close()
        connection.settings_dict["OPTIONS"] = base_options

    def ratio(side: str) -> float:
        return statistics.median(o / s for o, s in zip(rates["ours"], rates[side], strict=True))

    lines = [
        f"enqueue: {args.calls:,} debounced calls per side and round over {args.keys} keys "
        f"({opened['ours']} open a window, {args.calls - opened['ours']} slide), "
        f"{args.rounds} rounds, each call its own autocommit statement; "
        f"{rows_in_table:,} rows in the table at the end",
        "",
        table(
            ["side", "calls/s (median)", "ours / side (median of rounds)", "statements per call"],
            [
                [
                    side,
                    f"{statistics.median(rates[side]):.0f}",
                    "" if side == "ours" else f"{ratio(side):.2f}",
                    f"{statements:g}" if side.startswith("ours") else "1",
                ]
                for side in SIDES
            ],
        ),
        "",
        f"target: ours / raw psycopg >= 0.8 -> {ratio('raw psycopg'):.2f} "
        f"({'met' if ratio('raw psycopg') >= 0.8 else 'NOT met'})",
    ]
    return lines


# -- drain -----------------------------------------------------------------------------


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def fill_jobs(jobs: int) -> None:
    """Empty the job table and insert ``jobs`` due no-op jobs."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_debounce_job CASCADE")
        cursor.execute("TRUNCATE django_debounce_deadletter")
        cursor.execute(FILL, {"n": jobs, "task": NOOP})
        cursor.execute("ANALYZE django_debounce_job")


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["DEBOUNCE_PEERS_JOBS"] = str(args.jobs)
    env["DEBOUNCE_PEERS_REDIS"] = args.redis
    if args.conn_max_age is not None:
        env["DEBOUNCE_PEERS_CONN_MAX_AGE"] = args.conn_max_age
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def our_worker_cmd(concurrency: int) -> list[str]:
    return [
        "manage.py",
        "run_debounce_worker",
        "--burst",
        "--concurrency",
        str(concurrency),
        "-v",
        "0",
        "--settings",
        SETTINGS,
    ]


def celery_worker_cmd(concurrency: int, pool: str) -> list[str]:
    chosen = "solo" if concurrency == 1 else pool
    return [
        sys.executable,
        "-m",
        "celery",
        "--quiet",  # no banner
        "-A",
        "bench.peersapp.celery_bench",
        "worker",
        f"--pool={chosen}",
        f"--concurrency={concurrency}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=WARNING",
        "--queues=peers",
    ]


def wait_done(r: Any, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Block until the N-th job stamped the end (``BLPOP``), or fail on timeout or a dead worker."""
    from bench.peersapp import counter

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.blpop([counter.DONE], timeout=1):
            return
        if proc.poll() is not None:
            raise SystemExit(
                f"{what} exited with status {proc.returncode} after "
                f"{int(r.get(counter.COUNT) or 0)} of the jobs"
            )
    raise SystemExit(f"{what}: not done after {timeout:.0f} s ({r.get(counter.COUNT)} jobs)")


def stamps(r: Any, started: float, jobs: int) -> tuple[float, float]:
    """Return (whole, steady) jobs/s from the counter's stamps."""
    from bench.peersapp import counter

    first, last = float(r.get(counter.FIRST)), float(r.get(counter.LAST))
    return jobs / (last - started), (jobs - 1) / (last - first)


def database_counters() -> tuple[int, int]:
    """Return (transactions committed, sessions opened) in this database so far (flushed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()"
        )
        commits, sessions = cursor.fetchone()  # type: ignore[misc]
        return int(commits), int(sessions)


def drain_ours(args: argparse.Namespace, concurrency: int) -> tuple[float, float, float, float]:
    """Drain ``--jobs`` no-op jobs with a ``run_debounce_worker --burst`` subprocess.

    Returns jobs/s whole and steady, and the worker's committed transactions and new
    database sessions per job (``pg_stat_database.xact_commit`` and ``sessions``, read
    after the worker exited and flushed its statistics; each autocommit statement is one
    transaction; a session is a PostgreSQL connection, a forked server process).
    """
    from django_debounce.models import Job

    fill_jobs(args.jobs)
    r = redis_client(args.redis)
    r.flushdb()
    time.sleep(1.1)  # let this backend's own statistics flush (at most once a second)
    before = database_counters()
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, *our_worker_cmd(concurrency)], cwd=ROOT, env=worker_env(args)
    )
    try:
        wait_done(r, proc, args.timeout, "run_debounce_worker")
        result = stamps(r, started, args.jobs)
        if proc.wait(timeout=args.timeout) != 0:
            raise SystemExit(f"run_debounce_worker exited with status {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = database_counters()
    transactions = (after[0] - before[0]) / args.jobs
    sessions = (after[1] - before[1]) / args.jobs
    done = Job.objects.filter(task_name=NOOP, status=Job.Status.SUCCESSFUL).count()
    if done != args.jobs:
        raise SystemExit(f"run_debounce_worker: {done} of {args.jobs} jobs SUCCESSFUL")
    return (*result, transactions, sessions)


def drain_celery(args: argparse.Namespace, concurrency: int) -> tuple[float, float, float]:
    """Publish ``--jobs`` no-op tasks, drain them with a Celery worker; return rates + publish/s."""
    from bench.peersapp.celery_bench import noop

    r = redis_client(args.redis)
    r.flushdb()
    started = time.perf_counter()
    for n in range(args.jobs):
        noop.delay(n)
    published = args.jobs / (time.perf_counter() - started)
    # Celery's output (a SecurityWarning when run as root, the shutdown line) goes to a
    # file, shown only if the worker fails.
    log = tempfile.TemporaryFile()
    started = time.time()
    proc = subprocess.Popen(
        celery_worker_cmd(concurrency, args.celery_pool),
        cwd=ROOT,
        env=worker_env(args),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the prefork children go with it
    )
    try:
        wait_done(r, proc, args.timeout, "celery worker")
        whole, steady = stamps(r, started, args.jobs)
    except SystemExit:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # warm shutdown: nothing is running any more
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    return whole, steady, published


def drain_part(args: argparse.Namespace) -> list[str]:
    """Race our worker against Celery's at each concurrency; return the report's lines."""
    rows = []
    publish: list[float] = []
    for concurrency in args.concurrency:
        ours: list[tuple[float, float, float, float]] = []
        celery: list[tuple[float, float]] = []
        for round_no in range(args.drain_rounds):
            first_ours = (round_no + args.concurrency.index(concurrency)) % 2 == 0
            for side in ("ours", "celery") if first_ours else ("celery", "ours"):
                figures: tuple[float, ...]
                if side == "ours":
                    ours.append(drain_ours(args, concurrency))
                    figures = ours[-1]
                else:
                    *pair, published = drain_celery(args, concurrency)
                    celery.append((pair[0], pair[1]))
                    publish.append(published)
                    figures = celery[-1]
                print(
                    f"drain C={concurrency} round {round_no + 1} {side}: "
                    f"{figures[0]:.0f} jobs/s whole, {figures[1]:.0f} steady",
                    file=sys.stderr,
                    flush=True,
                )
        pool = "solo" if concurrency == 1 else args.celery_pool
        for i, label in enumerate(("whole", "steady")):
            ratios = [o[i] / c[i] for o, c in zip(ours, celery, strict=True)]
            rows.append(
                [
                    f"{concurrency} (ours: {'inline' if concurrency == 1 else 'threads'}; "
                    f"celery: {pool})",
                    label,
                    f"{statistics.median(o[i] for o in ours):.0f}",
                    f"{statistics.median(c[i] for c in celery):.0f}",
                    f"{statistics.median(ratios):.2f}",
                    f"{statistics.median(o[2] for o in ours):.2f}",
                    f"{statistics.median(o[3] for o in ours):.3f}",
                ]
            )
    return [
        f"drain: {args.jobs:,} pre-enqueued no-op jobs per run, {args.drain_rounds} round(s); "
        "whole = from starting the worker process to the last job, steady = first job to last",
        "",
        table(
            [
                "concurrency",
                "span",
                "ours jobs/s",
                "celery jobs/s",
                "ours / celery",
                "ours: transactions per job",
                "ours: connections per job",
            ],
            rows,
        ),
        "",
        "target: ours / celery >= 1.0; "
        f"(celery .delay() publish rate, for reference: {statistics.median(publish):.0f}/s)",
    ]


# -- profile ---------------------------------------------------------------------------

#: Self time is put in the first category whose test matches (filename, function name).
CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    (
        "waiting for the database (psycopg's wait: server work + network)",
        lambda f, n: "psycopg" in f and f.endswith("connection.py") and n == "wait",
    ),
    (
        "psycopg driver (sending, adapting parameters, loading rows)",
        lambda f, n: "psycopg" in f or "psycopg" in n,
    ),
    ("ORM: SQL compilation (sql/compiler.py)", lambda f, n: "django/db/models/sql/compiler" in f),
    (
        "ORM: query building (QuerySet, sql/query, where, expressions, lookups)",
        lambda f, n: "django/db/models/" in f and "/fields/" not in f,
    ),
    ("ORM: fields (prep, converters)", lambda f, n: "django/db/models/fields/" in f),
    ("Django db backend wrappers", lambda f, n: "django/db/" in f),
    ("django_debounce", lambda f, n: "django_debounce/" in f),
    ("other Django (signals, timezone, utils)", lambda f, n: "/django/" in f),
    ("logging", lambda f, n: "/logging/" in f),
    ("threads, locks, queues", lambda f, n: "threading" in f or "queue.py" in f),
    ("redis client (the bench's counter)", lambda f, n: "/redis/" in f),
    ("startup imports", lambda f, n: "importlib" in f or "<frozen" in f),
]

#: Functions whose cumulative time the profile report shows (substring of file:function).
HIGHLIGHTS = [
    "enqueueing/call.py:enqueue_call",
    "planning.py:plan_call",
    "upsert.py:slide_or_insert",
    "upsert.py:_from_row",
    "worker/loop.py:run",
    "claiming.py:claim_batch",
    "worker/loop.py:_process",
    "outcomes.py:record_success",
    "success_batches.py:write_successes",
    "worker/stop.py:_renew_leases",
    "backends/utils.py:execute",
    "sql/compiler.py:as_sql",
    "sql/compiler.py:execute_sql",
    "models/query.py:update",
    "models/query.py:filter",
    "__init__.py:info",
    "threading.py:start",
]


def summarize(path: Path, calls: int, what: str, top: int) -> list[str]:
    """Return the profile's self time by category, highlighted cumulative times and top functions."""
    stats = pstats.Stats(str(path))
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _cc, _nc, tt, _ct, _callers in entries.values())

    def category(key: tuple[str, int, str]) -> str | None:
        return next((c for c, test in CATEGORIES if test(key[0], key[2])), None)

    by_category: dict[str, float] = {}
    for key, (_cc, _nc, tt, _ct, callers) in entries.items():
        label = category(key)
        if label is None and callers:
            # A builtin or stdlib function (getattr, copy.copy, socket.recv, lock.acquire, …)
            # counts for whoever called it, in proportion to the time each caller spent in
            # it: the ORM's hasattr() and copy() calls are ORM time, the Redis client's
            # recv() is the counter's. (One level up only.)
            spent = sum(t[2] for t in callers.values()) or 1.0
            for caller, (_c, _n, caller_tt, _t) in callers.items():
                share = category(caller) or "other (stdlib, C)"
                by_category[share] = by_category.get(share, 0.0) + tt * caller_tt / spent
            continue
        label = label or "other (stdlib, C)"
        by_category[label] = by_category.get(label, 0.0) + tt
    lines = [
        f"{what}: {total:.2f} s of self time profiled for {calls:,} calls "
        f"({total / calls * 1000:.3f} ms each under cProfile)",
        "",
        table(
            ["self time in", "s", "share", "ms per call"],
            [
                [label, f"{tt:.2f}", f"{tt / total:.0%}", f"{tt / calls * 1000:.3f}"]
                for label, tt in sorted(by_category.items(), key=lambda item: -item[1])
            ],
        ),
        "",
    ]
    cumulative = []
    for pattern in HIGHLIGHTS:
        file_part, func = pattern.split(":")
        matches = [
            (ct, nc)
            for (filename, _line, name), (_cc, nc, _tt, ct, _callers) in entries.items()
            if name == func and filename.replace(os.sep, "/").endswith(file_part)
        ]
        if matches:
            ct = max(m[0] for m in matches)  # the outermost of recursive/overloaded matches
            nc = sum(m[1] for m in matches)
            cumulative.append([pattern, f"{nc:,}", f"{ct:.2f}", f"{ct / total:.0%}"])
    lines += [table(["function (cumulative)", "calls", "s", "share"], cumulative), ""]
    leaders = sorted(entries.items(), key=lambda item: -item[1][2])[:top]
    lines.append(
        table(
            ["top self time", "calls", "s", "share"],
            [
                [
                    f"{Path(filename).name}:{line}:{name}"[-80:],
                    f"{nc:,}",
                    f"{tt:.2f}",
                    f"{tt / total:.0%}",
                ]
                for (filename, line, name), (_cc, nc, tt, _ct, _callers) in leaders
            ],
        )
    )
    return lines


def profile_part(args: argparse.Namespace) -> list[str]:
    """Profile our enqueue loop in-process and a C=1 burst worker subprocess."""
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    sequence = key_sequence(args.calls, args.keys, seed=1234)
    profiler = cProfile.Profile()
    profiler.enable()
    run_ours("profile:", sequence)
    profiler.disable()
    profiler.dump_stats(str(out / "enqueue.prof"))
    lines = summarize(out / "enqueue.prof", args.calls, "enqueue (ours, Task.delay)", args.top)

    fill_jobs(args.jobs)
    r = redis_client(args.redis)
    r.flushdb()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(out / "worker.prof"),
            *our_worker_cmd(1),
        ],
        cwd=ROOT,
        env=worker_env(args),
        timeout=args.timeout * 3,
    )
    if proc.returncode != 0:
        raise SystemExit(f"profiled worker exited with status {proc.returncode}")
    lines += [
        "",
        *summarize(out / "worker.prof", args.jobs, "drain (ours, --concurrency 1)", args.top),
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["enqueue", "drain"], help="run one part only")
    parser.add_argument("--calls", type=int, default=2_000, help="enqueues per side and round")
    parser.add_argument("--keys", type=int, default=200, help="distinct debounce keys per round")
    parser.add_argument("--rounds", type=int, default=5, help="enqueue rounds (order rotates)")
    parser.add_argument("--jobs", type=int, default=3_000, help="no-op jobs per drain run")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 4],
        help="worker concurrencies to race (default 1 4)",
    )
    parser.add_argument(
        "--celery-pool",
        choices=["prefork", "threads"],
        default="prefork",
        help="Celery's pool above concurrency 1 (1 always uses solo)",
    )
    parser.add_argument(
        "--conn-max-age",
        default=None,
        help="CONN_MAX_AGE of our worker (seconds or None; default: bench.settings' 0, "
        "Django's default, which reconnects after every job in a worker thread)",
    )
    parser.add_argument("--drain-rounds", type=int, default=1, help="drain runs per side and C")
    parser.add_argument(
        "--redis",
        default="redis://127.0.0.1:6379/9",
        help="Redis database for Celery's broker and the counter (flushed; never 0)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per drain at most")
    parser.add_argument("--profile", metavar="DIR", help="also profile our side into DIR")
    parser.add_argument("--top", type=int, default=15, help="functions in the profile's top list")
    add_db_arguments(parser, "bench_hH_peers")
    args = parser.parse_args()
    if urlsplit(args.redis).path.strip("/") in {"", "0"}:
        sys.exit("--redis must name a database other than 0 (it is flushed)")
    os.environ["DEBOUNCE_PEERS_REDIS"] = args.redis  # before bench.peersapp.counter is imported
    os.environ["DEBOUNCE_PEERS_JOBS"] = str(args.jobs)
    setup(args)
    report: list[str] = []
    try:
        if args.only in (None, "enqueue"):
            report += [*enqueue_part(args), ""]
        if args.only in (None, "drain"):
            report += [*drain_part(args), ""]
        if args.profile:
            report += profile_part(args)
    finally:
        teardown(args)
        if args.only != "enqueue" or args.profile:
            redis_client(args.redis).flushdb()
    print()
    print("\n".join(report))


if __name__ == "__main__":
    main()
