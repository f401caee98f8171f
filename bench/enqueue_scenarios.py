# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: the enqueue scenarios of issue #12 beside raw psycopg, in one run.

    .venv/bin/python bench/enqueue_scenarios.py                  # defaults (~2 min)
    .venv/bin/python bench/enqueue_scenarios.py --smoke          # a few hundred calls (CI)
    .venv/bin/python bench/enqueue_scenarios.py --json out.json  # + the raw figures

PostgreSQL; creates and drops its own database (default ``bench_enqueue_scenarios``).
Every call is its own autocommit statement, as a view's would be. Scenarios,
each ``--rounds`` times (the order of ours and the baseline alternates per round):

* ``new jobs``: ``noop.delay(n)`` (plain job) vs a raw psycopg one-statement
  ``INSERT … RETURNING id`` of the same row;
* ``hot key``: ``debounced.delay("hot")`` (one window slid by every call) vs the
  raw one-statement upsert of ``bench/peers.py`` on one key;
* ``1,000 keys``: ``debounced.delay(f"k{n % 1000}")`` round-robin vs the raw upsert;
* ``8 producers, hot key`` / ``8 producers, 1,000 keys``: ``--producers`` processes
  (this script, ``--producer``) released by a barrier file, each sending
  ``--calls / producers`` calls through ``delay``; the rate is all calls over the
  wall time from the barrier to the last producer's end; afterwards the table
  must hold one row per key and every call counted, and no producer may have
  met an error. Its ratio is to the single-process scenario of the same keys;
* ``bulk 1,000``: ``noop.delay_many`` of ``--bulk`` calls (one multi-row
  ``INSERT``) vs one raw multi-row ``INSERT`` of the same rows, and
  ``debounced.delay_many`` over ``--bulk`` keys vs one raw multi-row upsert;
  the ratio to the single call's rate is the issue's "≥ 10 ×".

Columns: calls/s as the median over rounds with [min–max]; ``CPU µs/call``:
this process's CPU time (``time.process_time``) per call of ours (the Python
around the statement; the server runs elsewhere); ``ours / baseline``: the
median of the rounds' ratios. ``main(argv)`` is importable for a "run
everything" command; ``--smoke`` shrinks every count so the script runs in
seconds and never rots.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, add_db_arguments, setup, table, teardown  # noqa: E402
from bench.peers import RAW as RAW_UPSERT  # noqa: E402

NOOP = "bench.peers.noop"
DEBOUNCED = "bench.peers.debounced"

#: The row ``noop.delay(n)`` writes (plain READY job, due now), one statement.
RAW_INSERT_COLUMNS = (
    "task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, "
    "last_enqueued_at, attempts, max_retries, error, traceback, metadata, notes, "
    "created_at, worker_id"
)
RAW_INSERT_ROW = "(%s, 'default', 0, 'READY', %s, '{}', %s, 1, %s, 0, 0, '', '', '{}', '', %s, '')"


def _hash(key: str) -> str:
    import hashlib

    return hashlib.sha256(f"{DEBOUNCED}\x00{key}".encode()).hexdigest()


# -- one side of one scenario: returns (calls, wall seconds, CPU seconds) ----------------


def ours_single(keys: Callable[[int], str] | None, calls: int) -> tuple[int, float, float]:
    from bench.peersapp.tasks import debounced, noop

    wall, cpu = time.perf_counter(), time.process_time()
    if keys is None:
        for n in range(calls):
            noop.delay(n)
    else:
        for n in range(calls):
            debounced.delay(keys(n))
    return calls, time.perf_counter() - wall, time.process_time() - cpu


def ours_bulk(prefix: str | None, calls: int) -> tuple[int, float, float]:
    from bench.peersapp.tasks import debounced, noop

    wall, cpu = time.perf_counter(), time.process_time()
    if prefix is None:
        jobs = noop.delay_many([(n,) for n in range(calls)])
    else:
        jobs = debounced.delay_many([(f"{prefix}{n}",) for n in range(calls)])
    assert len(jobs) == calls
    return calls, time.perf_counter() - wall, time.process_time() - cpu


def raw_single(conn: Any, keys: Callable[[int], str] | None, calls: int, retries: int) -> Any:
    from psycopg.types.json import Jsonb

    insert = (
        f"INSERT INTO django_debounce_job ({RAW_INSERT_COLUMNS}) VALUES {RAW_INSERT_ROW} "
        "RETURNING id"
    )
    wall, cpu = time.perf_counter(), time.process_time()
    with conn.cursor() as cursor:
        for n in range(calls):
            now = datetime.now(UTC)
            if keys is None:
                cursor.execute(insert, (NOOP, Jsonb([n]), now, now, now))
            else:
                key = keys(n)
                text = f"k:{key}"
                cursor.execute(
                    RAW_UPSERT,
                    {
                        "task": DEBOUNCED,
                        "args": Jsonb([key]),
                        "now": now,
                        "key": text,
                        "hash": _hash(text),
                        "max_retries": retries,
                    },
                )
            cursor.fetchone()
    return calls, time.perf_counter() - wall, time.process_time() - cpu


def raw_bulk(conn: Any, prefix: str | None, calls: int, retries: int) -> Any:
    """One multi-row statement of ``calls`` rows (the driver's best case for a batch)."""
    from psycopg.types.json import Jsonb

    wall, cpu = time.perf_counter(), time.process_time()
    now = datetime.now(UTC)
    params: list[Any] = []
    if prefix is None:
        sql = f"INSERT INTO django_debounce_job ({RAW_INSERT_COLUMNS}) VALUES " + ", ".join(
            [RAW_INSERT_ROW] * calls
        )
        for n in range(calls):
            params += [NOOP, Jsonb([n]), now, now, now]
    else:
        head, rest = RAW_UPSERT.split("VALUES (", 1)
        row, tail = rest.split(")\nON CONFLICT", 1)
        row_sql = "(" + row.replace("%(task)s", "%s") + ")"
        names = [part.split(")s")[0] for part in row.split("%(")[1:]]
        sql = head + "VALUES " + ", ".join([row_sql] * calls) + "\nON CONFLICT" + tail
        sql = sql.replace("%(now)s", "%s").replace("%(args)s", "%s").replace("%(key)s", "%s")
        sql = sql.replace("%(hash)s", "%s").replace("%(max_retries)s", "%s")
        for n in range(calls):
            key = f"{prefix}{n}"
            text = f"k:{key}"
            values = {"task": DEBOUNCED, "args": Jsonb([key]), "now": now, "key": text}
            values |= {"hash": _hash(text), "max_retries": retries}
            params += [values[name] for name in names]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
    return calls, time.perf_counter() - wall, time.process_time() - cpu


# -- producers ----------------------------------------------------------------------------


def producer_main(options: argparse.Namespace) -> int:
    """Run in a producer subprocess: wait for the barrier, send the calls, report errors."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.db import connection

    from bench.peersapp.tasks import debounced

    connection.ensure_connection()
    Path(options.ready).touch()
    while not Path(options.go).exists():
        time.sleep(0.001)
    errors = []
    for n in range(options.calls):
        key = f"{options.prefix}{(n * 7 + options.producer) % options.keys}"
        try:
            debounced.delay(key)
        except Exception as exc:  # noqa: BLE001  (a benchmark reports every error)
            errors.append(f"{type(exc).__name__}: {exc}")
    Path(options.out).write_text(json.dumps({"errors": errors}))
    return 0


def run_producers(args: argparse.Namespace, prefix: str, keys: int) -> tuple[int, float, float]:
    """Run ``--producers`` processes on ``keys`` keys; check the rows; return (calls, wall, 0)."""
    import tempfile

    from django.db import connection

    each = max(1, args.calls // args.producers)
    with tempfile.TemporaryDirectory(prefix="bench-producers-") as tmp:
        work = Path(tmp)
        go = work / "go"
        env = dict(os.environ, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="bench.settings")
        procs = []
        for i in range(args.producers):
            cmd = [sys.executable, __file__, "--producer", str(i), "--prefix", prefix]
            cmd += ["--keys", str(keys), "--calls", str(each), "--go", str(go)]
            cmd += ["--ready", str(work / f"ready{i}"), "--out", str(work / f"out{i}.json")]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env))
        deadline = time.monotonic() + 120
        while not all((work / f"ready{i}").exists() for i in range(args.producers)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("a producer did not start")
            time.sleep(0.01)
        started = time.perf_counter()
        go.touch()
        codes = [p.wait(timeout=600) for p in procs]
        wall = time.perf_counter() - started
        errors = [e for i in range(args.producers) for e in _report(work / f"out{i}.json")]
    if any(codes) or errors:
        raise SystemExit(f"producers failed: exit codes {codes}, errors {errors[:3]}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT window_key), coalesce(sum(enqueue_count), 0) "
            "FROM django_debounce_job WHERE debounce_key LIKE %s",
            [f"k:{prefix}%"],
        )
        rows, distinct, counted = cursor.fetchone()
    total = each * args.producers
    if rows != min(keys, total) or distinct != rows or counted != total:
        raise SystemExit(
            f"producers on {keys} keys: {rows} rows, {distinct} windows, {counted} calls "
            f"counted; expected {min(keys, total)} rows and {total} calls"
        )
    return total, wall, 0.0


def _report(path: Path) -> list[str]:
    return json.loads(path.read_text())["errors"] if path.exists() else ["no report"]


# -- the run ------------------------------------------------------------------------------


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}–{max(values):,.0f}]"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every scenario ``--rounds`` times; return the raw figures."""
    import psycopg
    from django.conf import settings

    from django_debounce.conf import settings as debounce_settings

    db = settings.DATABASES["default"]
    dsn = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    raw = psycopg.connect(**dsn, autocommit=True)
    retries = debounce_settings.max_retries
    calls, bulk = args.calls, args.bulk
    results: dict[str, dict[str, list[Any]]] = {}

    def record(name: str, side: str, measured: tuple[int, float, float]) -> None:
        done, wall, cpu = measured
        entry = results.setdefault(name, {}).setdefault(side, [])
        entry.append({"calls": done, "seconds": wall, "cpu_seconds": cpu, "rate": done / wall})

    try:
        # Warm-up: connections, caches, prepared statements (not recorded).
        ours_single(lambda n: f"warm{n % 10}", 100)
        ours_single(None, 100)
        raw_single(raw, lambda n: f"warmraw{n % 10}", 100, retries)
        raw_single(raw, None, 100, retries)
        for r in range(args.rounds):
            pairs: list[tuple[str, str, Callable[[], Any]]] = [
                ("new jobs", "ours", lambda: ours_single(None, calls)),
                ("new jobs", "raw", lambda: raw_single(raw, None, calls, retries)),
                ("hot key", "ours", lambda r=r: ours_single(lambda n: f"hot{r}o", calls)),
                (
                    "hot key",
                    "raw",
                    lambda r=r: raw_single(raw, lambda n: f"hot{r}r", calls, retries),
                ),
                (
                    "1,000 keys",
                    "ours",
                    lambda r=r: ours_single(lambda n: f"rr{r}o:{n % 1000}", calls),
                ),
                (
                    "1,000 keys",
                    "raw",
                    lambda r=r: raw_single(raw, lambda n: f"rr{r}r:{n % 1000}", calls, retries),
                ),
                ("bulk, new jobs", "ours", lambda: ours_bulk(None, bulk)),
                ("bulk, new jobs", "raw", lambda: raw_bulk(raw, None, bulk, retries)),
                ("bulk, 1,000 keys", "ours", lambda r=r: ours_bulk(f"b{r}o:", bulk)),
                ("bulk, 1,000 keys", "raw", lambda r=r: raw_bulk(raw, f"b{r}r:", bulk, retries)),
            ]
            for i in range(0, len(pairs), 2):
                first, second = pairs[i], pairs[i + 1]
                for name, side, fn in (first, second) if r % 2 == 0 else (second, first):
                    record(name, side, fn())
            record("8 producers, hot key", "ours", run_producers(args, f"ph{r}:", 1))
            record("8 producers, 1,000 keys", "ours", run_producers(args, f"pk{r}:", 1000))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        raw.close()
    return results


def report(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Return the table (Markdown) and the target lines."""

    def rates(name: str, side: str) -> list[float]:
        return [m["rate"] for m in results[name][side]]

    def ratio(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b, strict=True))

    single = {
        "8 producers, hot key": "hot key",
        "8 producers, 1,000 keys": "1,000 keys",
        "bulk, new jobs": "new jobs",
        "bulk, 1,000 keys": "1,000 keys",
    }

    def cpu(name: str, side: str) -> str:
        spent = [m["cpu_seconds"] / m["calls"] * 1e6 for m in results[name].get(side, [])]
        return f"{statistics.median(spent):.0f}" if spent and all(spent) else "—"

    rows = []
    for name, sides in results.items():
        ours = rates(name, "ours")
        row = [name, _fmt(ours), cpu(name, "ours")]
        if "raw" in sides:
            raw = rates(name, "raw")
            row += [_fmt(raw), cpu(name, "raw"), f"{ratio(ours, raw):.2f}"]
        else:
            row += ["—", "—", "—"]
        row.append(f"{ratio(ours, rates(single[name], 'ours')):.1f}" if name in single else "—")
        rows.append(row)
    producers = args.producers
    lines = [
        f"enqueue scenarios: {args.calls:,} calls per single-process run, {args.bulk:,} per bulk "
        f"call, {producers} producer processes, {args.rounds} rounds; median [min–max]",
        "",
        table(
            [
                "scenario",
                "ours calls/s",
                "ours CPU µs/call",
                "raw psycopg calls/s",
                "raw CPU µs/call",
                "ours / raw",
                "ours / 1 process, single calls",
            ],
            rows,
        ),
        "",
    ]
    targets = [
        (
            "plain enqueue >= 0.8 x raw insert",
            ratio(rates("new jobs", "ours"), rates("new jobs", "raw")),
            0.8,
        ),
        (
            "debounced (hot key) >= 0.8 x raw upsert",
            ratio(rates("hot key", "ours"), rates("hot key", "raw")),
            0.8,
        ),
        (
            "bulk 1,000 new jobs >= 10 x single calls",
            ratio(rates("bulk, new jobs", "ours"), rates("new jobs", "ours")),
            10,
        ),
        (
            "8 producers on a hot key >= 1 x one producer",
            ratio(rates("8 producers, hot key", "ours"), rates("hot key", "ours")),
            1,
        ),
    ]
    for text, value, target in targets:
        lines.append(f"target: {text} -> {value:.2f} ({'met' if value >= target else 'NOT met'})")
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=2000, help="calls per single-process run")
    p.add_argument("--bulk", type=int, default=1000, help="calls per bulk call")
    p.add_argument("--producers", type=int, default=8, help="producer processes")
    p.add_argument("--rounds", type=int, default=3, help="rounds (at least 3 for the issue)")
    p.add_argument("--smoke", action="store_true", help="a tiny run (CI): 100 calls, 1 round")
    p.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(p, "bench_enqueue_scenarios")
    # A producer subprocess (internal): runs producer_main and exits.
    p.add_argument("--producer", type=int, help=argparse.SUPPRESS)
    for name in ("prefix", "go", "ready", "out"):
        p.add_argument(f"--{name}", help=argparse.SUPPRESS)
    p.add_argument("--keys", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.producer is not None:
        return producer_main(args)
    if args.smoke:
        args.calls, args.bulk, args.rounds, args.producers = 100, 100, 1, 2
    setup(args)
    try:
        results = run(args)
    finally:
        teardown(args)
    lines = report(results, args)
    print()
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
