# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: the job table's health under debounce slides at scale (issue #23 item 5).

    python3 dev.py bench table_health                  # 1M rows, 200k slides (~8 min alone)
    python3 dev.py bench table_health -- --smoke       # 20k rows, 100 keys (seconds; CI)
    python3 dev.py bench table_health -- --scale 0.1   # a tenth of the rows, slides, drain
    python3 dev.py bench table_health -- --migration 0012_job_trace_links   # without 0013

PostgreSQL; creates and drops its own database (default ``bench_table_health``).
One scenario, measured after each phase:

1. ``start``: ``--finished`` (1,000,000) finished rows (one ``INSERT … SELECT
   generate_series``, finished over the last 30 days) and ``--keys`` (1,000) open
   windows (a one-hour window, one-day max wait), then ``VACUUM (ANALYZE)``;
2. ``slides``: ``--slides`` (200,000) calls round-robin over the keys, each one
   ``Task.delay()`` in autocommit (the real enqueue API: one upsert statement each);
3. ``drain``: ``--drain`` (100,000) due plain jobs (``INSERT … SELECT``) claimed by the
   real ``claim_jobs(limit=100)`` and written SUCCESSFUL (the batched success's columns);
4. ``prune``: ``prune_jobs(older_than=7 days)`` (the real retention, ~77 % of the
   seeded rows), then a plain ``VACUUM`` (what autovacuum does next);
5. ``again``: the slides and the drain once more: the table must not grow past its size
   after the prune (the space the prune and VACUUM freed is reused).

Autovacuum runs as the server and the table's storage parameters say (the counts it
ran are a column). Each phase prints ``n_tup_upd``, ``n_tup_hot_upd`` and HOT share of
the phase's updates, ``n_dead_tup``, the heap and every index's size, and the claim:
``idle claim ms`` (median of ``--claims`` ``claim_jobs(limit=10)`` with nothing due:
what a polling worker pays), ``idle claim buffers`` (shared blocks of that claim's
statement under ``EXPLAIN (ANALYZE, BUFFERS)``: the machine's load does not move it),
``due claim ms`` (median of the claims of 1,000 due jobs, 10 per claim; those rows are
deleted afterwards). Then the targets: slides >= 90 % HOT, claim after the slides <= 1.2 x
its start, the table after ``again`` <= 1.05 x its size after the prune.

``--lazy-run-at`` is an experiment, not the package: the bench database gets a column
``window_deadline`` and the slide writes the sliding deadline there instead of
``run_at`` (the design of decision 221; the claim is unchanged, so it is only right
here because no window comes due during the run). ``--fillfactor``, ``--autovacuum``
and ``--full-claim-index`` set the table up otherwise, to measure each change alone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

TABLE = "django_debounce_job"
TASK = "bench.table_health.plain"
SLIDE = "bench.table_health.slide"
MIB = 1024 * 1024

FINISHED = f"""
INSERT INTO {TABLE} (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, started_at,
    finished_at, worker_id)
SELECT %(task)s, 'default', 0, 'SUCCESSFUL', jsonb_build_array(g), '{{}}'::jsonb,
    now() - interval '30 days' * g / %(n)s, 1, now() - interval '30 days' * g / %(n)s,
    1, 0, '', '', '{{}}'::jsonb, '', now() - interval '30 days' * g / %(n)s,
    now() - interval '30 days' * g / %(n)s, now() - interval '30 days' * g / %(n)s, 'old'
FROM generate_series(1, %(n)s) g
"""

DUE = f"""
INSERT INTO {TABLE} (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, worker_id)
SELECT %(task)s, 'default', 0, 'READY', jsonb_build_array(g), '{{}}'::jsonb,
    now() - interval '1 second', 1, now(), 0, 0, '', '', '{{}}'::jsonb, '', now(), ''
FROM generate_series(1, %(n)s) g
"""


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def stats() -> dict[str, Any]:
    """The table's counters and sizes, this backend's statistics flushed and read afresh."""
    sql("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)  # other backends flush theirs at most once a second
    sql("SELECT pg_stat_clear_snapshot()")
    ((upd, hot, live, dead, autovacuums),) = sql(
        "SELECT n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup, autovacuum_count "
        "FROM pg_stat_user_tables WHERE relid = %s::regclass",
        [TABLE],
    )
    indexes = dict(
        sql(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
            "WHERE relid = %s::regclass ORDER BY indexrelname",
            [TABLE],
        )
    )
    ((heap, total),) = sql("SELECT pg_relation_size(%s), pg_total_relation_size(%s)", [TABLE] * 2)
    return {
        "upd": upd,
        "hot": hot,
        "live": live,
        "dead": dead,
        "autovacuums": autovacuums,
        "heap": heap,
        "total": total,
        "indexes": indexes,
    }


def claim_times(claims: int) -> dict[str, Any]:
    """Time the real claim with nothing due (median of ``claims``) and with 1,000 due jobs."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from django_debounce.claim.claiming import claim_jobs

    lease = timedelta(minutes=10)
    with CaptureQueriesContext(connection) as captured:
        assert claim_jobs(worker_id="bench", limit=10, lease=lease) == []
    statement = max((q["sql"] for q in captured.captured_queries), key=len)
    idle = []
    for _ in range(claims):
        started = time.perf_counter()
        claim_jobs(worker_id="bench", limit=10, lease=lease)
        idle.append((time.perf_counter() - started) * 1000)
    with transaction.atomic():
        ((plan,),) = sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement)
        transaction.set_rollback(True)
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    sql(DUE, {"task": TASK, "n": 1000})
    due, claimed = [], 0
    while claimed < 1000:
        started = time.perf_counter()
        batch = claim_jobs(worker_id="bench", limit=10, lease=lease)
        due.append((time.perf_counter() - started) * 1000)
        if not batch:
            raise SystemExit(f"claimed {claimed} of 1,000 due jobs")
        claimed += len(batch)
    sql(f"DELETE FROM {TABLE} WHERE status = 'RUNNING' AND task_name = %s", [TASK])
    return {
        "idle_ms": statistics.median(idle),
        "idle_buffers": buffers,
        "due_ms": statistics.median(due),
    }


class Autovacuum:
    """Autovacuum's trigger rule, run by the bench every ``naptime`` seconds of a phase.

    Only when the server's ``autovacuum`` is off (as on the shared test server): then
    the table's per-table settings would do nothing, so the bench runs a plain
    ``VACUUM`` whenever autovacuum would have (dead tuples over ``threshold + scale
    factor x reltuples``, or inserts since the last vacuum over the insert threshold),
    with the table's storage parameters, else the server's settings.
    """

    SETTINGS = (
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_insert_threshold",
        "autovacuum_vacuum_insert_scale_factor",
    )

    def __init__(self, naptime: float) -> None:
        ((on,),) = sql("SELECT current_setting('autovacuum')")
        self.emulated = on != "on"
        self.naptime = naptime
        self.last = time.monotonic()
        self.runs = 0

    def describe(self) -> str:
        if not self.emulated:
            return "autovacuum: the server's"
        return f"autovacuum: off on the server, emulated by the bench every {self.naptime:g} s"

    def tick(self) -> None:
        if self.emulated and time.monotonic() - self.last >= self.naptime:
            self.last = time.monotonic()
            self.check()

    def check(self) -> None:
        sql("SELECT pg_stat_force_next_flush()")
        sql("SELECT pg_stat_clear_snapshot()")
        ((dead, inserted, tuples, options),) = sql(
            "SELECT s.n_dead_tup, s.n_ins_since_vacuum, greatest(c.reltuples, 0), c.reloptions "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.relid = %s::regclass",
            [TABLE],
        )
        table_options = dict(option.split("=", 1) for option in options or [])
        values = []
        for name in self.SETTINGS:
            if name in table_options:
                values.append(float(table_options[name]))
            else:
                ((server,),) = sql("SELECT current_setting(%s)", [name])
                values.append(float(server))
        threshold, scale, insert_threshold, insert_scale = values
        if dead > threshold + scale * tuples or inserted > insert_threshold + insert_scale * tuples:
            sql(f"VACUUM {TABLE}")
            self.runs += 1


def slide(task: Any, calls: int, keys: int, vacuum: Autovacuum) -> float:
    """``calls`` single ``task.delay()`` calls round-robin over ``keys`` windows; return calls/s."""
    started = time.perf_counter()
    for n in range(calls):
        job = task.delay(f"k{n % keys}")
        if job.outcome != "debounced":
            raise SystemExit(f"call {n} was {job.outcome!r}, not a slide")
        if n % 500 == 0:
            vacuum.tick()
    return calls / (time.perf_counter() - started)


def drain(jobs: int, vacuum: Autovacuum) -> None:
    """Insert ``jobs`` due plain jobs, claim them 100 at a time and write them SUCCESSFUL."""
    from datetime import timedelta

    from django.utils import timezone

    from django_debounce.claim.claiming import claim_jobs
    from django_debounce.models import Job

    sql(DUE, {"task": TASK, "n": jobs})
    done = 0
    while done < jobs:
        batch = claim_jobs(worker_id="bench", limit=100, lease=timedelta(minutes=10))
        if not batch:
            raise SystemExit(f"drained {done} of {jobs} jobs")
        done += Job.objects.filter(
            pk__in=[job.pk for job in batch], status=Job.Status.RUNNING
        ).update(
            status=Job.Status.SUCCESSFUL,
            result=None,
            finished_at=timezone.now(),
            lease_expires_at=None,
            unique_lock=None,
        )
        vacuum.tick()


def prune() -> int:
    """The real retention: finished jobs older than 7 days; then a plain VACUUM."""
    from datetime import timedelta

    from django_debounce.ops.retention import prune_jobs

    pruned = prune_jobs(older_than=timedelta(days=7), batch_size=5000).jobs
    sql(f"VACUUM {TABLE}")
    return pruned


def set_up_table(args: argparse.Namespace) -> None:
    """Apply the experiments' storage parameters and indexes to the bench database."""
    if args.fillfactor:
        sql(f"ALTER TABLE {TABLE} SET (fillfactor = {int(args.fillfactor)})")
    if args.autovacuum:
        sql(
            f"ALTER TABLE {TABLE} SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.05)"
        )
    if args.full_claim_index:
        sql("DROP INDEX IF EXISTS debounce_job_claim")
        sql(f"CREATE INDEX debounce_job_claim ON {TABLE} (status, priority DESC, run_at, id)")
    if args.lazy_run_at:
        sql(f"ALTER TABLE {TABLE} ADD COLUMN window_deadline timestamptz")
        from django_debounce.enqueueing import upsert

        original = upsert._sql.__wrapped__

        def lazy(*a: Any, **kw: Any) -> tuple[str, tuple[str, ...]]:
            statement, names = original(*a, **kw)
            assignment = f'"run_at" = LEAST(EXCLUDED."run_at", "{TABLE}"."max_run_at")'
            assert assignment in statement, statement
            return statement.replace(assignment, '"window_deadline" = ' + assignment[11:]), names

        upsert._sql = lazy  # type: ignore[assignment]


def storage_parameters() -> str:
    ((options,),) = sql("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [TABLE])
    index = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'debounce_job_claim'")
    return f"table {options or '(defaults)'}; claim index: {index[0][0] if index else 'none'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished rows seeded")
    parser.add_argument("--keys", type=int, default=1_000, help="open windows slid")
    parser.add_argument("--slides", type=int, default=200_000, help="slides per cycle")
    parser.add_argument("--drain", type=int, default=100_000, help="jobs drained per cycle")
    parser.add_argument("--claims", type=int, default=50, help="idle claims timed per phase")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the rows, slides and drain by this"
    )
    parser.add_argument("--smoke", action="store_true", help="--scale 0.02, 100 keys (CI: seconds)")
    parser.add_argument(
        "--naptime", type=float, default=60.0, help="s between emulated autovacuum checks"
    )
    parser.add_argument("--fillfactor", type=int, default=0, help="experiment: table fillfactor")
    parser.add_argument("--autovacuum", action="store_true", help="experiment: per-table vacuum")
    parser.add_argument("--full-claim-index", action="store_true", help="experiment: no partial")
    parser.add_argument("--lazy-run-at", action="store_true", help="experiment: see above")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    add_db_arguments(parser, "bench_table_health")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale, args.keys, args.naptime = 0.02, min(args.keys, 100), 1.0
    if args.scale != 1.0:
        for name in ("finished", "slides", "drain"):
            setattr(args, name, max(10, int(getattr(args, name) * args.scale)))
        args.claims = max(5, int(args.claims * min(1.0, args.scale * 5)))
    setup(args)
    from django_debounce import debounced_task, task

    @debounced_task(name=SLIDE, debounce="1h", debounce_max_wait="1d", debounce_key="{0}")
    def slid(key: str) -> None:
        """A window an hour long: every call of the run slides it."""

    @task(name=TASK)
    def plain() -> None:
        """A plain job, drained."""

    phases: list[dict[str, Any]] = []

    def measure(name: str, **extra: Any) -> None:
        figures = stats()
        if vacuum.emulated:
            figures["autovacuums"] = vacuum.runs
        claims = claim_times(args.claims)
        after = stats()  # the claims' own updates belong to no phase
        counted = {"upd_after_claims": after["upd"], "hot_after_claims": after["hot"]}
        phases.append({"phase": name, **figures, **claims, **counted, **extra})
        print(f"table_health {name}: {phases[-1]}", file=sys.stderr, flush=True)

    try:
        set_up_table(args)
        vacuum = Autovacuum(args.naptime)
        setup_text = f"{storage_parameters()}; {vacuum.describe()}"
        sql(FINISHED, {"task": TASK, "n": args.finished})
        for n in range(args.keys):
            slid.delay(f"k{n}")
        sql(f"VACUUM (ANALYZE) {TABLE}")
        measure("start")
        measure("slides", calls_per_s=slide(slid, args.slides, args.keys, vacuum))
        drain(args.drain, vacuum)
        measure("drain")
        measure("prune", pruned=prune())
        rate = slide(slid, args.slides, args.keys, vacuum)
        drain(args.drain, vacuum)
        measure("again", calls_per_s=rate)
    finally:
        teardown(args)
    report(args, phases, setup_text)
    return 0


def report(args: argparse.Namespace, phases: list[dict[str, Any]], setup_text: str) -> None:
    names = sorted(phases[0]["indexes"])
    rows, previous = [], phases[0]
    for p in phases:
        upd = p["upd"] - previous["upd_after_claims"] if p is not previous else 0
        hot = p["hot"] - previous["hot_after_claims"] if p is not previous else 0
        p["phase_updates"], p["phase_hot"] = upd, hot
        rows.append(
            [
                p["phase"],
                f"{upd:,}",
                f"{hot:,} ({hot / upd:.0%})" if upd else "0",
                f"{p['dead']:,}",
                f"{p['autovacuums']}",
                f"{p['heap'] / MIB:.1f}",
                *(f"{p['indexes'].get(n, 0) / MIB:.2f}" for n in names),
                f"{p['total'] / MIB:.1f}",
                f"{p['idle_ms']:.2f}",
                f"{p['idle_buffers']:,}",
                f"{p['due_ms']:.2f}",
            ]
        )
        previous = p
    short = [re.sub(r"^(django_)?debounce_job_|_[0-9a-f]{8}", "", n) for n in names]
    print(
        f"table_health: {args.finished:,} finished rows, {args.keys:,} windows, "
        f"{args.slides:,} slides and {args.drain:,} drained jobs per cycle; {setup_text}"
    )
    print(
        table(
            ["phase", "updates", "HOT", "dead", "autovac", "heap MiB"]
            + [f"{n} MiB" for n in short]
            + ["total MiB", "idle claim ms", "idle claim buffers", "due claim ms"],
            rows,
        )
    )
    start, slid, pruned, again = (phases[i] for i in (0, 1, 3, 4))
    share = slid["phase_hot"] / max(1, slid["phase_updates"])
    checks = [
        ("slides are HOT updates", f"{share:.1%}", ">= 90%", share >= 0.9),
        (
            "idle claim after slides / start",
            f"{slid['idle_ms'] / start['idle_ms']:.2f} ms, "
            f"{slid['idle_buffers'] / start['idle_buffers']:.2f} buffers",
            "<= 1.2",
            slid["idle_ms"] / start["idle_ms"] <= 1.2,
        ),
        (
            "due claim after slides / start",
            f"{slid['due_ms'] / start['due_ms']:.2f}",
            "<= 1.2",
            slid["due_ms"] / start["due_ms"] <= 1.2,
        ),
        (
            "table after a second cycle / after prune",
            f"{again['total'] / pruned['total']:.2f}",
            "<= 1.05",
            again["total"] <= pruned["total"] * 1.05,
        ),
    ]
    print(
        table(
            ["target", "figure", "needed", "verdict"],
            [[a, b, c, "met" if ok else "missed"] for a, b, c, ok in checks],
        )
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "setup": setup_text, "phases": phases}, indent=1)
        )


if __name__ == "__main__":
    sys.exit(main())
