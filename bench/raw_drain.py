# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: what the database allows a drain: raw psycopg claim + finish loops (issue #12).

    python3 dev.py bench raw_drain                     # 10,000 jobs, batches 1, 10, 100
    python3 dev.py bench raw_drain -- --smoke          # 300 jobs, 1 round

PostgreSQL; its own database (default ``bench_raw_drain``, created and dropped),
the package's job table filled with ``--jobs`` due no-op jobs (``bench/peers.py``'s
``INSERT … SELECT``). One hand-written psycopg 3 loop in this process (no Django,
no task code: the no-op is nothing) per ``--batches`` size B:

* claim B due jobs in one transaction: ``UPDATE … SET status = 'RUNNING' WHERE id
  IN (SELECT id … WHERE status = 'READY' AND run_at <= now() ORDER BY priority
  DESC, run_at, id LIMIT B FOR UPDATE SKIP LOCKED) RETURNING id``, commit;
* finish them in one statement: ``UPDATE … SET status = 'SUCCESSFUL' WHERE id =
  ANY(…)``, commit.

B = 1 is "claim + finish, 2 commits per job"; 10 and 100 are the batched loops
of the issue's table. Prints jobs/s per B (median [min–max] over ``--rounds``);
the suite puts our drain beside it ("what share of it you reach").
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

CLAIM = """
UPDATE django_debounce_job SET status = 'RUNNING', started_at = now(), worker_id = 'raw',
    attempts = attempts + 1
WHERE id IN (
    SELECT id FROM django_debounce_job
    WHERE status = 'READY' AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id
"""
FINISH = """
UPDATE django_debounce_job SET status = 'SUCCESSFUL', finished_at = now()
WHERE id = ANY(%s) AND worker_id = 'raw'
"""


def drain(conn: Any, batch: int, jobs: int) -> float:
    """Claim and finish every due job ``batch`` at a time; return jobs/s."""
    done = 0
    started = time.perf_counter()
    with conn.cursor() as cursor:
        while True:
            cursor.execute(CLAIM, [batch])
            ids = [row[0] for row in cursor.fetchall()]
            conn.commit()
            if not ids:
                break
            cursor.execute(FINISH, [ids])
            conn.commit()
            done += len(ids)
    elapsed = time.perf_counter() - started
    if done != jobs:
        raise SystemExit(f"batch {batch}: drained {done} of {jobs} jobs")
    return jobs / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="300 jobs, 1 round (CI)")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(parser, "bench_raw_drain")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.rounds = 300, 1
    setup(args)
    import psycopg
    from django.conf import settings

    from bench.peers import fill_jobs

    db = settings.DATABASES["default"]
    conn = psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    )
    results: dict[str, list[float]] = {str(b): [] for b in args.batches}
    try:
        for round_no in range(args.rounds):
            order = args.batches if round_no % 2 == 0 else list(reversed(args.batches))
            for batch in order:
                fill_jobs(args.jobs)
                results[str(batch)].append(drain(conn, batch, args.jobs))
            print(f"raw_drain round {round_no + 1}: {results}", file=sys.stderr, flush=True)
    finally:
        conn.close()
        teardown(args)
    rows = [
        [
            f"{b} per claim" + (" (2 commits per job)" if b == "1" else ""),
            f"{statistics.median(v):,.0f} [{min(v):,.0f}–{max(v):,.0f}]",
        ]
        for b, v in results.items()
    ]
    print(table(["raw psycopg loop", "jobs/s"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
