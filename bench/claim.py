# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: claims per second on the plain path, the flow-control gate and CoDel (§6).

    .venv/bin/python bench/claim.py                   # 20,000 due jobs, batches of 10
    .venv/bin/python bench/claim.py --jobs 5000 --limit 1

PostgreSQL only; creates and drops its own database (default ``bench_hH_claim``).
Each variant starts from ``--jobs`` due READY plain jobs of ``bench.claim.plain``
(queue ``default``, no key) and claims them all with ``claim.claim_jobs(limit=…)``
in one process, one transaction per batch, as a worker's loop would (no task
runs: the figure is the claim's own cost). Variants, alternated for ``--rounds``:

* ``plain``: no gated task registered: the claim's fast path.
* ``gate (other task)``: one task with ``rate_limit="1000000/s"`` registered
  (not the jobs' task): every claim goes through the admission gate.
* ``gate (jobs' task)``: the jobs' own task has that generous rate limit: each
  claimed job takes a token from its TaskState row.
* ``gate (jobs' task, Redis bucket)``: as the previous one with
  ``DEBOUNCE_REDIS`` naming a django-redis cache on the local Redis (database
  14; ``--redis-url``): each claimed job takes its token with one Lua script in
  Redis, and no TaskState row is locked (decision 101).
* ``CoDel``: ``DEBOUNCE_QUEUES={"default": {"codel": {"target": "1h",
  "interval": "2h"}}}``: the queue's CoDel state is locked and stepped on
  every claim; the target is never exceeded, so nothing is shed.

Prints claimed jobs per second (median over rounds), the ratio to ``plain``
(median over rounds of the ratio within a round; the order of the variants is
reversed every other round so a drift in the machine's load cancels out), and
the queries of one claim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

FILL = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, enqueue_count, last_enqueued_at,
    attempts, max_retries, error, traceback, metadata, notes, created_at, worker_id)
SELECT %(task)s, 'default', 0, 'READY', jsonb_build_array(g), '{}'::jsonb,
    now() - interval '1 second' * (%(n)s - g) / 1000, 1, now(), 0, 0, '', '', '{}'::jsonb, '',
    now(), ''
FROM generate_series(1, %(n)s) g
"""

PLAIN = "bench.claim.plain"
REDIS_VARIANT = "gate (jobs' task, Redis bucket)"
VARIANTS = ["plain", "gate (other task)", "gate (jobs' task)", REDIS_VARIANT, "CoDel"]


def refill(jobs: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_debounce_job CASCADE")
        cursor.execute(
            "TRUNCATE django_debounce_taskstate, django_debounce_queuestate, "
            "django_debounce_deadletter"
        )
        cursor.execute(FILL, {"n": jobs, "task": PLAIN})
        cursor.execute("ANALYZE django_debounce_job")


def claim_all(jobs: int, limit: int) -> tuple[float, int]:
    """Claim every due job in batches of ``limit``; return (claims per second, queries per claim).

    The query count is that of the second claim (the first creates the state rows), counted
    with ``CaptureQueriesContext`` outside the timing.
    """
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_debounce.claim.claiming import claim_jobs
    from django_debounce.models import Job

    first = len(claim_jobs(worker_id="bench", limit=limit, lease=timedelta(minutes=10)))
    with CaptureQueriesContext(connection) as captured:
        first += len(claim_jobs(worker_id="bench", limit=limit, lease=timedelta(minutes=10)))
    queries = len(captured.captured_queries)
    claimed = first
    started = time.perf_counter()
    while True:
        batch = claim_jobs(worker_id="bench", limit=limit, lease=timedelta(minutes=10))
        if not batch:
            break
        claimed += len(batch)
    elapsed = time.perf_counter() - started
    running = Job.objects.filter(status=Job.Status.RUNNING).count()
    if claimed != jobs or running != jobs:
        raise SystemExit(
            f"claimed {claimed} (RUNNING {running}) of {jobs} jobs: something was held"
        )
    return (claimed - first) / elapsed, queries


def check_path(variant: str) -> None:
    """Fail unless the variant's flow-control state rows were written (its path really ran)."""
    from django_debounce.flow.rules import current_gates
    from django_debounce.models import QueueState, TaskState

    if variant.startswith("gate") and not current_gates():
        raise SystemExit(f"{variant}: no gated task is registered")
    states = {
        "gate (jobs' task)": TaskState.objects.filter(task_name=PLAIN),
        "CoDel": QueueState.objects.filter(queue="default"),
    }
    if variant in states and not states[variant].exists():
        raise SystemExit(f"{variant}: no state row was written; the claim took another path")
    if variant == REDIS_VARIANT:
        from django_debounce.flow import redis_buckets
        from django_debounce.flow.throttle import bucket_for

        store = redis_buckets.store()
        level = store.levels({PLAIN: bucket_for("1/s")})[PLAIN] if store is not None else None
        if (
            TaskState.objects.filter(task_name=PLAIN).exists()
            or level is None
            or level.tokens_at is None
        ):
            raise SystemExit(f"{variant}: the bucket was not in Redis")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="due jobs per variant")
    parser.add_argument("--limit", type=int, default=10, help="jobs per claim (a worker's room)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the variants")
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/14",
        help="Redis of the Redis-bucket variant (its keys are deleted afterwards)",
    )
    add_db_arguments(parser, "bench_hH_claim")
    args = parser.parse_args()
    setup(args)
    from django.test import override_settings

    from django_debounce import registry
    from django_debounce.tasks import task

    def register(variant: str) -> None:
        for name in ("bench.claim.limited", PLAIN):
            if registry.lookup(name) is not None:
                registry.unregister(name)
        if variant == "gate (other task)":
            task(name="bench.claim.limited", rate_limit="1000000/s")(lambda: None)
        limited = variant in ("gate (jobs' task)", REDIS_VARIANT)
        task(name=PLAIN, **({"rate_limit": "1000000/s"} if limited else {}))(lambda: None)

    codel = {"default": {"codel": {"target": "1h", "interval": "2h"}}}
    prefix = f"bench-claim-{os.getpid()}"
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "bench": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": args.redis_url,
            "KEY_PREFIX": prefix,
        },
    }
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    queries: dict[str, int] = {}
    try:
        for round_no in range(args.rounds):
            # Reverse the order every other round so a drift in the machine's load cancels out.
            for variant in VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]:
                register(variant)
                refill(args.jobs)
                redis = (
                    {"DEBOUNCE_REDIS": "bench", "CACHES": caches}
                    if variant == REDIS_VARIANT
                    else {}
                )
                with override_settings(
                    DEBOUNCE_QUEUES=codel if variant == "CoDel" else {}, **redis
                ):
                    rate, queries[variant] = claim_all(args.jobs, args.limit)
                    check_path(variant)
                    if redis:
                        from django_redis import get_redis_connection

                        get_redis_connection("bench").delete(
                            *get_redis_connection("bench").keys(f"{prefix}:*")
                        )
                results[variant].append(rate)
                print(
                    f"round {round_no + 1} {variant}: {rate:.0f} claims/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        teardown(args)

    def ratio(variant: str) -> float:
        """Median over rounds of the variant's rate divided by plain's in the same round."""
        pairs = zip(results[variant], results["plain"], strict=True)
        return statistics.median(rate / plain for rate, plain in pairs)

    rows = [
        [
            variant,
            f"{statistics.median(rates):.0f}",
            f"{ratio(variant):.2f}",
            queries[variant],
        ]
        for variant, rates in results.items()
    ]
    print()
    print(f"{args.jobs:,} due jobs, claimed {args.limit} per transaction")
    print(
        table(["claim path", "claims/s", "ratio to plain (same round)", "queries per claim"], rows)
    )


if __name__ == "__main__":
    main()
