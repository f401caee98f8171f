# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: the real commit stream replayed in real time at a high speed-up (issue #12).

    python3 dev.py bench replay_stream                   # all 17,536 events, 3 rounds
    python3 dev.py bench replay_stream -- --smoke        # 300 events, 1 round
    .venv/bin/python bench/replay_stream.py --speed 200000 --json out.json

The stream is ``../shared/data/commit_file_events.csv`` beside the repository
(``--events``; see that folder's README: every file changed by every commit of
a public repository, 2010–2026). It is replayed by the example project's own
real-time mode (``manage.py replay_events --real-time``:
``example_project/docs/replay.py``): one producer enqueues
``rebuild_docs(directory)`` debounced per folder at trace time / ``--speed``
(window 3,600 and max wait 7,200 trace seconds, shrunk by the same factor;
quiet gaps cut to two windows) while a ``run_debounce_worker --concurrency
--worker-concurrency --poll-interval --poll`` subprocess runs the windows.
PostgreSQL; its own database (default ``bench_replay_stream``, created and
dropped), the example project's settings.

Prints per round and as medians: events/s sustained (events over the real
time from the first enqueue to the last one's commit), the producer's worst
lag behind schedule (ms; small means the producer kept up, so the rate is the
stream's, not a ceiling), windows opened and runs, and the deadline→start
delay (``started_at - run_at`` of every run, real ms) p50/p99/max. The check of
the replay itself (every event counted in a window, no key with two READY
windows) fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import _admin_connection, add_db_arguments, table  # noqa: E402

EVENTS = ROOT.parent / "shared" / "data" / "commit_file_events.csv"


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def setup(args: argparse.Namespace) -> None:
    """Create the database, point the example project's settings at it, migrate."""
    name = urlsplit(args.url).path.lstrip("/")
    if not name.startswith("bench_"):
        sys.exit(f"refusing to (re)create database {name!r}: its name must start with bench_")
    with _admin_connection(args.url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def teardown(args: argparse.Namespace) -> None:
    from django.db import connections

    connections.close_all()
    if not args.keep:
        name = urlsplit(args.url).path.lstrip("/")
        with _admin_connection(args.url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_round(args: argparse.Namespace, events: list[Any]) -> dict[str, Any]:
    from django_debounce.models import Job
    from example_project.docs.replay import replay_real_time, reset
    from example_project.docs.tasks import rebuild_docs

    reset()
    summary = replay_real_time(
        events,
        window=args.window,
        max_wait=args.max_wait,
        speed=args.speed,
        poll_interval=args.poll,
        concurrency=args.worker_concurrency,
        skip_idle=True,
        progress=lambda n=1: None,
    )
    problems = list(summary.violations[:3])
    if summary.calls != summary.events:
        problems.append(f"the jobs count {summary.calls} calls for {summary.events} events")
    if summary.unfinished:
        problems.append(f"{summary.unfinished} jobs not successful")
    if problems:
        raise SystemExit("replay: " + "; ".join(problems))
    late = [
        (started - run_at).total_seconds() * 1000
        for started, run_at in Job.objects.filter(
            task_name=rebuild_docs.name, started_at__isnull=False
        ).values_list("started_at", "run_at")
    ]
    span = summary.call_times[-1][1] if summary.call_times else float("nan")
    return {
        "events": summary.events,
        "replay_seconds": span,
        "events_per_s": summary.events / span,
        "producer_max_lag_ms": summary.max_lag * 1000,
        "windows": summary.windows,
        "runs": summary.runs,
        "delay_p50_ms": statistics.median(late),
        "delay_p99_ms": percentile(late, 99),
        "delay_max_ms": max(late),
        "worker_exit": summary.worker_exit,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=Path, default=EVENTS, help="timestamp,author,path CSV")
    parser.add_argument("--limit", type=int, default=None, help="replay the first N events")
    parser.add_argument("--speed", type=float, default=1_000_000.0, help="trace s per real s")
    parser.add_argument("--window", type=float, default=3600.0, help="trace seconds")
    parser.add_argument("--max-wait", type=float, default=7200.0, help="trace seconds")
    parser.add_argument("--poll", type=float, default=0.01, help="the worker's --poll-interval")
    parser.add_argument("--worker-concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="300 events, 1 round (CI)")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(parser, "bench_replay_stream")
    args = parser.parse_args(argv)
    if args.smoke:
        args.limit, args.rounds = 300, 1
    if not args.events.exists():
        sys.exit(f"no event stream at {args.events} (see ../shared/data/README)")
    setup(args)
    from example_project.docs.events import load_events

    events = load_events(args.events, args.limit)
    rounds: list[dict[str, Any]] = []
    try:
        for round_no in range(args.rounds):
            rounds.append(one_round(args, events))
            shown = {k: round(v, 1) for k, v in rounds[-1].items() if isinstance(v, float)}
            print(f"replay round {round_no + 1}: {shown}", file=sys.stderr, flush=True)
    finally:
        teardown(args)

    def cell(key: str, digits: int = 0) -> str:
        values = [r[key] for r in rounds]
        return (
            f"{statistics.median(values):,.{digits}f} "
            f"[{min(values):,.{digits}f}–{max(values):,.{digits}f}]"
        )

    print(
        f"replay of {rounds[0]['events']:,} events at {args.speed:,.0f}x "
        f"(window {args.window / args.speed * 1000:.2f} ms real), {args.rounds} round(s)"
    )
    print(
        table(
            [
                "events/s",
                "producer lag max ms",
                "windows",
                "runs",
                "delay p50 ms",
                "delay p99 ms",
                "delay max ms",
            ],
            [
                [
                    cell("events_per_s"),
                    cell("producer_max_lag_ms", 1),
                    cell("windows"),
                    cell("runs"),
                    cell("delay_p50_ms", 1),
                    cell("delay_p99_ms", 1),
                    cell("delay_max_ms", 1),
                ]
            ],
        )
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"args": {**vars(args), "events": str(args.events)}, "rounds": rounds}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
