# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: enqueue throughput with and without a migration (default: the admin indexes, 0003).

    .venv/bin/python bench/enqueue.py                 # 200,000 jobs in the table, 1,000 calls each
    .venv/bin/python bench/enqueue.py --rows 20000 --calls 500
    .venv/bin/python bench/enqueue.py --without 0006_job_finished_at_index --with 0007_wakeup_notify

PostgreSQL only; creates and drops its own database (default ``bench_hH_enqueue``).
The table is first filled with ``--rows`` jobs (the mix of
``admin_changelists.py``), so the indexes have a realistic depth. Then, for
``--rounds`` rounds, alternately at migration ``--without`` (default
``0002_flow_control``) and ``--with`` (default ``0003_admin_indexes``; e.g.
``0007_wakeup_notify`` against ``0006_job_finished_at_index`` for the LISTEN/NOTIFY
triggers), migrated back and forth on the same table, it times
``--calls`` plain enqueues (``Task.delay``, one INSERT each) and ``--calls``
debounced enqueues over ``--calls // 2`` keys (half open a window, half slide
one), each call in its own transaction, and one ``INSERT … SELECT`` of
``10 * --calls`` plain rows (``SQL``: the server-side cost alone). It prints calls per second (median
over rounds; the ratio is the median of each round's with/without pair, so a
drift in the machine's load cancels out) and the WAL bytes written per call
(``pg_current_wal_lsn`` before and after): the extra write work of the
indexes, a figure that does not depend on how busy the CPU is, and the CPU time the
server process spent per call (``/proc/<pid>/stat`` of the connection's backend, so only
with the server on this host; 10 ms ticks, fine over 1,000 calls): the server-side cost,
which does not depend on the machine's load either.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

WITHOUT = "0002_flow_control"
WITH = "0003_admin_indexes"
#: ``plain``/``debounced``: ``Task.delay`` calls; ``SQL``: one INSERT … SELECT of as many rows.
KINDS = ("plain", "debounced", "SQL")

#: The same rows as plain enqueues, written by one statement: the index cost without Python.
SQL_INSERT = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, worker_id)
SELECT 'bench.enqueue.sql', 'default', 0, 'READY', jsonb_build_array(g), '{}'::jsonb,
    now(), 1, now(), 0, 3, '', '', '{}'::jsonb, '', now(), ''
FROM generate_series(1, %(n)s) g
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="jobs in the table first")
    parser.add_argument("--calls", type=int, default=1_000, help="enqueues per kind and round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds without/with the indexes")
    parser.add_argument("--without", default=WITHOUT, help="migration of the 'without' state")
    parser.add_argument("--with", dest="with_", default=WITH, help="migration of the 'with' state")
    add_db_arguments(parser, "bench_hH_enqueue")
    args = parser.parse_args()
    setup(args)
    from django.core.management import call_command
    from django.db import connection

    from bench.admin_changelists import fill
    from django_debounce.tasks import debounced_task, task

    plain = task(name="bench.enqueue.plain")(lambda n: None)
    debounced = debounced_task(
        name="bench.enqueue.debounced", debounce="10m", debounce_max_wait="1h", debounce_key="k:{0}"
    )(lambda n: None)
    results: dict[str, dict[str, list[float]]] = {
        state: {f"{kind}{wal}": [] for kind in KINDS for wal in ("", "_wal", "_cpu")}
        for state in ("without", "with")
    }

    def wal_position() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            return int(cursor.fetchone()[0])

    def server_cpu() -> float:
        """CPU seconds this connection's server process has used (Linux, server on this host)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def timed(state: str, kind: str, calls: Callable[[], None], count: int) -> None:
        wal = wal_position()
        cpu = server_cpu()
        started = time.perf_counter()
        calls()
        results[state][kind].append(count / (time.perf_counter() - started))
        results[state][kind + "_cpu"].append((server_cpu() - cpu) / count * 1e6)
        results[state][kind + "_wal"].append((wal_position() - wal) / count)

    try:
        seconds = fill(args.rows)
        print(f"filled {args.rows:,} jobs in {seconds:.1f} s", flush=True)
        serial = 0
        for i in range(min(args.calls, 200)):  # warm up: connection, caches, plans
            plain.delay(-i)
            debounced.delay(-i)
        for round_no in range(args.rounds):
            # Alternate the order (without, with / with, without) so a drift in the
            # machine's load does not favour one side.
            order = ("without", "with") if round_no % 2 == 0 else ("with", "without")
            for state in order:
                target = args.without if state == "without" else args.with_
                call_command("migrate", "django_debounce", target, verbosity=0)
                first = serial

                def plain_calls(first: int = first) -> None:
                    for n in range(first, first + args.calls):
                        plain.delay(n)

                def sql_insert() -> None:
                    with connection.cursor() as cursor:
                        cursor.execute(SQL_INSERT, {"n": 10 * args.calls})

                def debounced_calls(first: int = first) -> None:
                    for n in range(args.calls):
                        debounced.delay(first + n // 2)  # each key twice: insert, then slide

                timed(state, "plain", plain_calls, args.calls)
                timed(state, "debounced", debounced_calls, args.calls)
                timed(state, "SQL", sql_insert, 10 * args.calls)
                serial += args.calls
                print(
                    f"round {round_no + 1} {state} {args.with_}: "
                    f"plain {results[state]['plain'][-1]:.0f}/s, "
                    f"debounced {results[state]['debounced'][-1]:.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        teardown(args)
    rows = []
    for kind in KINDS:
        without = results["without"][kind]
        with_ = results["with"][kind]
        pair_ratios = [w / wo for w, wo in zip(with_, without, strict=True)]
        wal_without = statistics.median(results["without"][kind + "_wal"])
        wal_with = statistics.median(results["with"][kind + "_wal"])
        rows.append(
            [
                kind,
                f"{statistics.median(without):.0f}",
                f"{statistics.median(with_):.0f}",
                f"{statistics.median(pair_ratios):.2f}",
                f"{wal_without:.0f}",
                f"{wal_with:.0f}",
                f"{wal_with / wal_without:.2f}",
                f"{statistics.median(results['without'][kind + '_cpu']):.0f}",
                f"{statistics.median(results['with'][kind + '_cpu']):.0f}",
            ]
        )
    print()
    print(f"{args.rows:,} jobs in the table; {args.calls:,} calls per kind, state and round")
    print(
        table(
            [
                "enqueue",
                f"calls/s at {args.without}",
                f"calls/s at {args.with_}",
                "ratio (median of rounds)",
                "WAL bytes/call without",
                "WAL bytes/call with",
                "WAL ratio",
                "server CPU µs/call without",
                "server CPU µs/call with",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
