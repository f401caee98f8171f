# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: admin changelists and details with 1M jobs vs a 10k-job baseline (issue #4).

    .venv/bin/python bench/admin_changelists.py              # 1,000,000 jobs, 10,000 baseline
    .venv/bin/python bench/admin_changelists.py --rows 200000
    .venv/bin/python bench/admin_changelists.py --migration 0002_flow_control   # without 0003 indexes

PostgreSQL only. Creates its own database (default ``bench_hH``), fills
``django_debounce_job`` with ``--baseline-rows`` rows, times every page, then
refills it with ``--rows`` rows and times them again. Per page it prints the
median milliseconds of ``--loads`` loads (after one warm-up) through Django's
test client as a logged-in superuser, the number of queries of one load, the
slowest query's plan (its scan nodes from ``EXPLAIN``: ``Seq Scan`` means a
full read of the table), and the ratio of the large run's median to the
baseline's. A page that stays bounded shows a ratio near 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, median_ms, setup, table, teardown  # noqa: E402

#: Task names of the filled rows: TASKS[0] is the most common, RARE_TASK ~0.1% of rows.
TASKS = [f"bench.task_{i:02d}" for i in range(20)]
RARE_TASK = "bench.rare_report"

FILL_JOBS = """
INSERT INTO django_debounce_job (
    id, task_name, queue, priority, status, args, kwargs, run_at, opened_at, max_run_at,
    debounce_key, window_key, key_hash, unique_key, unique_lock, enqueue_count,
    last_enqueued_at, attempts, max_retries, result, error, traceback, metadata, notes,
    expires_at, created_at, started_at, finished_at, worker_id, lease_expires_at)
SELECT
    g, task, queue, 0, status, jsonb_build_array(g, 'x'), '{}'::jsonb,
    CASE WHEN status = 'READY' AND key IS NOT NULL THEN now() + r5 * interval '10 minutes'
         WHEN key IS NOT NULL THEN created + interval '30 seconds' ELSE created END,
    CASE WHEN key IS NOT NULL THEN created END,
    CASE WHEN key IS NOT NULL THEN created + interval '10 minutes' END,
    key,
    CASE WHEN status = 'READY' AND key IS NOT NULL THEN md5(g::text) END,
    CASE WHEN key IS NOT NULL THEN encode(sha256(
        convert_to(task, 'UTF8') || '\\x00'::bytea || convert_to(key, 'UTF8')), 'hex') END,
    NULL, NULL,
    CASE WHEN key IS NOT NULL THEN 1 + floor(r4 * 5)::int ELSE 1 END,
    created,
    CASE WHEN status IN ('READY') THEN 0 ELSE 1 END,
    3,
    CASE WHEN status = 'SUCCESSFUL' THEN '"ok"'::jsonb END,
    CASE WHEN status = 'FAILED' THEN 'builtins.ValueError: boom' ELSE '' END,
    CASE WHEN status = 'FAILED' THEN 'Traceback (most recent call last):\n  ...\nValueError: boom'
         ELSE '' END,
    '{}'::jsonb, '', NULL, created,
    CASE WHEN status NOT IN ('READY', 'CANCELLED', 'EXPIRED', 'SHED')
         THEN created + interval '31 seconds' END,
    CASE WHEN status NOT IN ('READY', 'RUNNING') THEN created + interval '32 seconds' END,
    CASE WHEN status NOT IN ('READY') THEN 'bench-host:1234' ELSE '' END,
    CASE WHEN status = 'RUNNING' THEN now() + interval '1 minute' END
FROM (
    SELECT g, created, queue, task, key, r4, r5,
        CASE
            WHEN g > %(n)s * 0.975 AND key IS NOT NULL THEN 'READY'      -- open windows (~1%%)
            WHEN g > %(n)s * 0.975 AND r5 < 0.9 THEN 'READY'             -- plain, due soon
            WHEN g > %(n)s * 0.975 THEN 'RUNNING'
            WHEN r5 < 0.94 THEN 'SUCCESSFUL'
            WHEN r5 < 0.97 THEN 'FAILED'
            WHEN r5 < 0.98 THEN 'CANCELLED'
            WHEN r5 < 0.99 THEN 'EXPIRED'
            ELSE 'SHED'
        END AS status
    FROM (
        SELECT g, r4, r5,
            now() - interval '30 days' * (1 - g::float / %(n)s) AS created,
            CASE WHEN r2 < 0.70 THEN 'default' WHEN r2 < 0.85 THEN 'emails'
                 WHEN r2 < 0.95 THEN 'reports' ELSE 'low' END AS queue,
            CASE WHEN r1 < 0.001 THEN %(rare)s
                 ELSE 'bench.task_' || lpad(floor(20 * r1 * r1 * r1)::int::text, 2, '0') END AS task,
            CASE WHEN r3 < 0.4 THEN 'user:' || floor(r4 * 200000)::int END AS key
        FROM (
            SELECT g, random() r1, random() r2, random() r3, random() r4, random() r5
            FROM generate_series(1, %(n)s) g
        ) raw
    ) mixed
) final
"""

FILL_DEAD_LETTERS = """
INSERT INTO django_debounce_deadletter (
    id, job_id, task_name, queue, args, kwargs, reason, kind, metadata, error, traceback,
    created_at, retried_at, retry_job_id, retry_depth)
SELECT g, 1 + floor(r1 * (%(n)s - 1))::bigint,
    CASE WHEN r2 < 0.001 * 20 THEN %(rare)s
         ELSE 'bench.task_' || lpad(floor(20 * r2 * r2 * r2)::int::text, 2, '0') END,
    CASE WHEN r3 < 0.8 THEN 'default' ELSE 'emails' END,
    jsonb_build_array(g), '{}'::jsonb,
    CASE WHEN r4 < 0.70 THEN 'failed: builtins.ValueError: boom'
         WHEN r4 < 0.85 THEN 'shed: rate limit 10/s exceeded'
         WHEN r4 < 0.95 THEN 'codel: queue default sojourn 2.1s above target 500ms'
         ELSE 'unknown_task: no task named bench.gone is registered' END,
    CASE WHEN r4 < 0.70 THEN 'failure' WHEN r4 < 0.85 THEN 'shed'
         WHEN r4 < 0.95 THEN 'codel' ELSE 'unknown_task' END,
    '{}'::jsonb,
    CASE WHEN r4 < 0.70 THEN 'builtins.ValueError: boom' ELSE '' END,
    CASE WHEN r4 < 0.70 THEN 'Traceback (most recent call last):\n  ...\nValueError: boom'
         ELSE '' END,
    now() - interval '30 days' * (1 - g::float / %(d)s),
    NULL, NULL, 0
FROM (
    SELECT g, random() r1, random() r2, random() r3, random() r4 FROM generate_series(1, %(d)s) g
) raw
"""


def fill(rows: int) -> float:
    """Empty the tables and fill ``rows`` jobs and ``rows // 20`` dead letters; return seconds."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_debounce_deadletter, django_debounce_job CASCADE")
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(FILL_JOBS, {"n": rows, "rare": RARE_TASK})
        cursor.execute(FILL_DEAD_LETTERS, {"n": rows, "d": max(rows // 20, 1), "rare": RARE_TASK})
        for table_name in ("django_debounce_job", "django_debounce_deadletter"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table_name}', 'id'), "
                f"(SELECT max(id) FROM {table_name}))"
            )
    connection.close()
    from django.db import connections

    with connections["default"].cursor() as cursor:  # VACUUM outside a transaction
        cursor.execute("VACUUM ANALYZE django_debounce_job")
        cursor.execute("VACUUM ANALYZE django_debounce_deadletter")
    return time.perf_counter() - started


def pages(rows: int) -> list[tuple[str, str]]:
    """Return (label, url) of every page measured, for a table of ``rows`` jobs."""
    from django.utils import timezone

    from django_debounce.models import DeadLetter, Job

    now = timezone.now()
    week = (now - timedelta(days=7)).date()
    old = (now - timedelta(days=21)).date()
    open_job = Job.objects.open_windows().order_by("id").first()
    key = open_job.debounce_key if open_job else "user:1"
    middle = rows // 2
    letter = DeadLetter.objects.order_by("id").first()
    jobs, windows, letters = (
        "/admin/django_debounce/job/",
        "/admin/django_debounce/openwindow/",
        "/admin/django_debounce/deadletter/",
    )
    return [
        ("jobs", jobs),
        ("jobs status=FAILED", jobs + "?status__exact=FAILED"),
        ("jobs status=RUNNING (rare)", jobs + "?status__exact=RUNNING"),
        ("jobs queue=low", jobs + "?queue=low"),
        ("jobs task=common", jobs + f"?task={TASKS[0]}"),
        ("jobs task=rare (0.1%)", jobs + f"?task={RARE_TASK}"),
        (
            "jobs date=past 7 days",
            jobs + f"?created_at__gte={week}&created_at__lt={now.date() + timedelta(days=1)}",
        ),
        (
            "jobs date=one day 3 weeks ago",
            jobs + f"?created_at__gte={old}&created_at__lt={old + timedelta(days=1)}",
        ),
        ("jobs search id", jobs + f"?q={middle}"),
        ("jobs search key", jobs + f"?q={key}"),
        ("jobs search task", jobs + f"?q={RARE_TASK}"),
        ("jobs search no match", jobs + "?q=no-such-thing"),
        ("open windows", windows),
        ("open windows task=common", windows + f"?task={TASKS[0]}"),
        ("open windows search key", windows + f"?q={key}"),
        ("dead letters", letters),
        *[
            (f"dead letters kind={kind}", letters + f"?kind={kind}")
            for kind in ("failure", "shed", "codel", "unknown_task")
        ],
        ("dead letters task=rare", letters + f"?task={RARE_TASK}"),
        ("dead letters search id", letters + f"?q={letter.pk if letter else 1}"),
        ("job detail", f"/admin/django_debounce/job/{middle}/change/"),
        (
            "dead letter detail",
            f"/admin/django_debounce/deadletter/{letter.pk if letter else 1}/change/",
        ),
    ]


def explain(sql: str) -> tuple[float, str]:
    """Return ``(execution ms, scan nodes)`` of ``EXPLAIN ANALYZE sql``.

    The scan nodes read like ``Index Scan Backward job_pkey; Seq Scan deadletter``.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        kind = node["Node Type"]
        if "Scan" in kind:
            target = node.get("Index Name") or node.get("Relation Name") or ""
            target = target.replace("django_debounce_", "")
            direction = " Backward" if node.get("Scan Direction") == "Backward" else ""
            found.append(f"{kind}{direction} {target}".strip())
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return plan[0]["Execution Time"], "; ".join(dict.fromkeys(found)) or "(no scan)"


def measure(client: Any, label: str, url: str, loads: int) -> dict[str, Any]:
    """Time ``url``; count one load's queries and explain the slowest on the package's tables."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def load() -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"{label}: {url} answered {response.status_code}")

    ms = median_ms(load, loads)
    with CaptureQueriesContext(connection) as captured:
        load()
    ours = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("SELECT") and "django_debounce_" in q["sql"]
    ]
    slowest_ms, plan = max((explain(sql) for sql in ours), default=(0.0, "-"))
    return {
        "ms": ms,
        "queries": len(captured.captured_queries),
        "slowest_ms": slowest_ms,
        "plan": plan,
    }


def run_size(rows: int, loads: int) -> dict[str, dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    seconds = fill(rows)
    print(f"filled {rows:,} jobs and {rows // 20:,} dead letters in {seconds:.1f} s", flush=True)
    user_model = get_user_model()
    user = user_model.objects.filter(
        username="bench"
    ).first() or user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    results = {}
    for label, url in pages(rows):
        results[label] = measure(client, label, url, loads)
        print(f"  {label}: {results[label]['ms']:.1f} ms", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="jobs in the large run")
    parser.add_argument(
        "--baseline-rows", type=int, default=10_000, help="jobs in the baseline run"
    )
    parser.add_argument("--loads", type=int, default=5, help="timed loads per page (median)")
    add_db_arguments(parser, "bench_hH")
    args = parser.parse_args()
    name = setup(args)
    from django.db import connection

    from django_debounce.tasks import task

    for registered in [*TASKS, RARE_TASK]:  # the task filter's choices come from the registry
        task(name=registered)(lambda: None)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT string_agg(indexname, ', ' ORDER BY indexname) FROM pg_indexes "
                "WHERE tablename IN ('django_debounce_job', 'django_debounce_deadletter')"
            )
            indexes = cursor.fetchone()[0]
        print(f"database {name}; indexes: {indexes}")
        base = run_size(args.baseline_rows, args.loads)
        large = run_size(args.rows, args.loads)
    finally:
        teardown(args)
    rows = []
    for label, big in large.items():
        small = base[label]
        rows.append(
            [
                label,
                f"{small['ms']:.1f}",
                f"{big['ms']:.1f}",
                f"{big['ms'] / small['ms']:.2f}",
                f"{small['queries']}/{big['queries']}",
                f"{big['slowest_ms']:.1f}",
                big["plan"],
            ]
        )
    print()
    print(
        table(
            [
                "page",
                f"ms @{args.baseline_rows:,}",
                f"ms @{args.rows:,}",
                "ratio",
                "queries (base/large)",
                "slowest query ms @large",
                "slowest query plan @large",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
