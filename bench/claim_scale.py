# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: the claim at 10,000 vs 1,000,000 finished rows, with its EXPLAIN (issue #12).

    python3 dev.py bench claim_scale                   # 10k vs 1M, 3 rounds (~1 min)
    python3 dev.py bench claim_scale -- --smoke        # 1k vs 10k, 1 round
    .venv/bin/python bench/claim_scale.py --json out.json

PostgreSQL; creates and drops its own database (default ``bench_claim_scale``).
For each size in ``--sizes`` (smallest first; the table grows, it is not refilled):
the job table holds that many finished rows (SUCCESSFUL, finished over the last
30 days, one ``INSERT … SELECT``, then ``ANALYZE``); each round adds ``--due`` due
plain READY jobs and claims them all with ``claim.claim_jobs(limit=--limit)`` in
one process, as a worker's loop does (no task runs), timing each claim; the
claimed rows are deleted afterwards. Then the claim statement (captured from a
real claim) is run once more under ``EXPLAIN (ANALYZE, BUFFERS)`` in a
transaction that is rolled back.

Prints, per size: ms per claim (median of the rounds' medians [min–max]),
the ratio to the smallest size (the target: ≤ 1.2 at 1M), the plan's
execution time and buffers, and the plan. ``--json`` writes every figure and
the plans.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

TASK = "bench.claim_scale.plain"

FINISHED = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, started_at,
    finished_at, worker_id)
SELECT %(task)s, 'default', 0, 'SUCCESSFUL', jsonb_build_array(g), '{}'::jsonb,
    now() - interval '30 days' * g / %(n)s, 1, now() - interval '30 days' * g / %(n)s,
    1, 0, '', '', '{}'::jsonb, '', now() - interval '30 days' * g / %(n)s,
    now() - interval '30 days' * g / %(n)s, now() - interval '30 days' * g / %(n)s, 'old'
FROM generate_series(1, %(n)s) g
"""

DUE = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, worker_id)
SELECT %(task)s, 'default', 0, 'READY', jsonb_build_array(g), '{}'::jsonb,
    now() - interval '1 second', 1, now(), 0, 0, '', '', '{}'::jsonb, '', now(), ''
FROM generate_series(1, %(n)s) g
"""


def execute(sql: str, params: dict[str, Any] | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def claim_round(due: int, limit: int) -> tuple[list[float], str]:
    """Add ``due`` jobs, claim them all; return ms per claim and one claim's SQL statement."""
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_debounce.claim.claiming import claim_jobs

    execute(DUE, {"task": TASK, "n": due})
    lease = timedelta(minutes=10)
    with CaptureQueriesContext(connection) as captured:
        claimed = len(claim_jobs(worker_id="bench", limit=limit, lease=lease))
    statement = max((q["sql"] for q in captured.captured_queries), key=len)
    times = []
    while True:
        started = time.perf_counter()
        batch = claim_jobs(worker_id="bench", limit=limit, lease=lease)
        times.append((time.perf_counter() - started) * 1000)
        if not batch:
            break
        claimed += len(batch)
    if claimed != due:
        raise SystemExit(f"claimed {claimed} of {due} due jobs")
    execute("DELETE FROM django_debounce_job WHERE status = 'RUNNING'")
    return times[:-1] or times, statement


def explain(statement: str, due: int) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) the claim with ``due`` jobs waiting, rolled back."""
    from django.db import connection, transaction

    execute(DUE, {"task": TASK, "n": due})
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement)
            plan = cursor.fetchone()[0]
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement)
            text = [row[0] for row in cursor.fetchall()]
            transaction.set_rollback(True)
    finally:
        execute("DELETE FROM django_debounce_job WHERE status = 'READY'")
    top = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
    blocks = sum(top["Plan"].get(k, 0) for k in ("Shared Hit Blocks", "Shared Read Blocks"))
    return {"execution_ms": top["Execution Time"], "buffers": blocks, "plan": text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--due", type=int, default=2_000, help="due jobs claimed per round")
    parser.add_argument("--limit", type=int, default=10, help="jobs per claim")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="1k vs 10k rows, 1 round (CI)")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(parser, "bench_claim_scale")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.due, args.rounds = [1_000, 10_000], 200, 1
    sizes = sorted(args.sizes)
    setup(args)
    results: list[dict[str, Any]] = []
    try:
        have = 0
        for size in sizes:
            execute(FINISHED, {"task": TASK, "n": size - have})
            have = size
            execute("VACUUM ANALYZE django_debounce_job")
            rounds, statement = [], ""
            for _ in range(args.rounds):
                times, statement = claim_round(args.due, args.limit)
                rounds.append(statistics.median(times))
            results.append(
                {"finished_rows": size, "ms_per_claim": rounds, **explain(statement, args.due)}
            )
            print(f"claim_scale {size:,}: {rounds}", file=sys.stderr, flush=True)
    finally:
        teardown(args)
    base = statistics.median(results[0]["ms_per_claim"])
    rows = []
    for r in results:
        ms = r["ms_per_claim"]
        r["ratio"] = statistics.median(ms) / base
        rows.append(
            [
                f"{r['finished_rows']:,}",
                f"{statistics.median(ms):.2f} [{min(ms):.2f}–{max(ms):.2f}]",
                f"{r['ratio']:.2f}",
                f"{r['execution_ms']:.2f}",
                f"{r['buffers']:,}",
            ]
        )
    print(
        table(
            ["finished rows", "ms per claim", "ratio", "EXPLAIN ms", "EXPLAIN buffers"],
            rows,
        )
    )
    for r in results:
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) at {r['finished_rows']:,} finished rows:")
        print("\n".join(r["plan"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
