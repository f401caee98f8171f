# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: one enqueue call, in autocommit and inside a caller's transaction (issue #23 item 3).

    python3 dev.py bench enqueue_calls                     # 2,000 calls per side, 5 rounds
    python3 dev.py bench enqueue_calls -- --calls 300 --rounds 1   # a quick look

Every side runs in every round, interleaved call by call in an order that
rotates (figures are medians over the round's calls), on one PostgreSQL
database of its own (``--url``, default ``bench_enqueue_calls``), so the ratios
come from one run on one machine:

**autocommit** (each call its own statement, calls/s):

* ``ours plain``: ``noop.delay(n)`` of a plain task; ``raw plain``: the same row
  with one hand-written psycopg 3 ``INSERT … RETURNING id`` (psycopg's defaults).
* ``ours slide``: ``debounced.delay(key)`` over ``--keys`` keys, most calls
  sliding an open window; ``raw slide``: bench/peers.py's hand-written
  ``INSERT … ON CONFLICT (window_key) DO UPDATE … RETURNING``, same keys.

**in a transaction** (µs a call adds to a transaction that already runs one
``SELECT 1``: the median transaction with the call, minus the median of the
same transaction without it, timed alternately):

* ``ours plain`` / ``ours slide``: the calls above inside ``transaction.atomic()``;
* ``ours plain in a savepoint`` / ``ours slide in a savepoint``: the same calls
  wrapped in ``transaction.atomic()``, which sends what every call sent before
  decision 205 (``SAVEPOINT``, the write, ``RELEASE``): before and after in one run;
* ``raw plain``: the raw ``INSERT`` inside a psycopg transaction;
* ``celery delay_on_commit``: a Celery task's ``delay_on_commit`` on Redis
  (``--redis``; the message is published when the transaction commits, so its
  cost lands in the timed transaction, as in a view).

Prints the medians over the rounds, the ratios of the issue's targets (ours /
raw in autocommit ≥ 0.8; added per call inside a transaction ≤ Celery's
``delay_on_commit``; ours / raw inside a transaction, for the database's share),
and the statements each of ours sends per call inside a transaction
(``CaptureQueriesContext``). A loaded database moves the ratio to Celery (which
writes to Redis, not PostgreSQL), not the ratios to raw psycopg.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402
from bench.peers import DEBOUNCED, NOOP, RAW  # noqa: E402

#: The row ``noop.delay(n)`` writes, by hand: one statement, the new id returned.
RAW_PLAIN = """
INSERT INTO django_debounce_job (
    task_name, queue, priority, status, args, kwargs, run_at, opened_at, max_run_at,
    debounce_key, window_key, key_hash, unique_key, unique_lock, enqueue_count,
    last_enqueued_at, attempts, max_retries, result, error, traceback, metadata, notes,
    expires_at, created_at, started_at, finished_at, worker_id, lease_expires_at)
VALUES (
    %(task)s, 'default', 0, 'READY', %(args)s, '{}', %(now)s, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, 1, %(now)s, 0, 0, NULL, '', '', '{}', '', NULL, %(now)s, NULL, NULL, '', NULL)
RETURNING id
"""

AUTOCOMMIT = ("ours plain", "raw plain", "ours slide", "raw slide")
IN_TRANSACTION = (
    "ours plain",
    "ours slide",
    "ours plain in a savepoint",
    "ours slide in a savepoint",
    "raw plain",
    "celery delay_on_commit",
)


def celery_task(redis_url: str) -> Any:
    """Return a no-op Celery task of Celery's Django task class (``delay_on_commit``)."""
    from celery import Celery

    app = Celery(
        "enqueue_calls", broker=redis_url, task_cls="celery.contrib.django.task:DjangoTask"
    )
    app.conf.update(task_ignore_result=True, task_default_queue="enqueue_calls")

    @app.task(name="bench.enqueue_calls.noop")  # type: ignore[untyped-decorator]
    def noop(n: int) -> None:
        """Never run: only published."""

    return noop


def raw_params(n: int, prefix: str, key_number: int | None = None) -> dict[str, Any]:
    """Return the raw statements' parameters of call ``n`` (a key number for a slide)."""
    from psycopg.types.json import Jsonb

    if key_number is None:
        return {"task": NOOP, "args": Jsonb([n]), "now": datetime.now(UTC)}
    key = f"k:{prefix}{key_number}"
    return {
        "task": DEBOUNCED,
        "args": Jsonb([f"{prefix}{key_number}"]),
        "now": datetime.now(UTC),
        "key": key,
        "hash": hashlib.sha256(f"{DEBOUNCED}\x00{key}".encode()).hexdigest(),
        "max_retries": 0,
    }


def run(args: argparse.Namespace) -> list[str]:
    """Time every side of every round; return the report's lines."""
    import psycopg
    from django.conf import settings
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from bench.peersapp.tasks import debounced, noop

    db = settings.DATABASES["default"]
    dsn = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    raw = psycopg.connect(**dsn, autocommit=True)
    raw_tx = psycopg.connect(**dsn)
    celery_noop = celery_task(args.redis)
    keys = args.keys

    def ours_plain(n: int, prefix: str) -> None:
        noop.delay(n)

    def ours_slide(n: int, prefix: str) -> None:
        debounced.delay(f"{prefix}{n % keys}")

    def raw_plain(n: int, prefix: str) -> None:
        raw.execute(RAW_PLAIN, raw_params(n, prefix)).fetchone()

    def raw_slide(n: int, prefix: str) -> None:
        raw.execute(RAW, raw_params(n, prefix, n % keys)).fetchone()

    autocommit: dict[str, Callable[[int, str], None]] = {
        "ours plain": ours_plain,
        "raw plain": raw_plain,
        "ours slide": ours_slide,
        "raw slide": raw_slide,
    }

    def django_tx(call: Callable[[int, str], None] | None) -> Callable[[int, str], None]:
        def one(n: int, prefix: str) -> None:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                if call is not None:
                    call(n, prefix)

        return one

    def in_savepoint(call: Callable[[int, str], None]) -> Callable[[int, str], None]:
        def one(n: int, prefix: str) -> None:
            with transaction.atomic():
                call(n, prefix)

        return one

    def raw_tx_call(call: bool) -> Callable[[int, str], None]:
        def one(n: int, prefix: str) -> None:
            with raw_tx.transaction():
                raw_tx.execute("SELECT 1").fetchone()
                if call:
                    raw_tx.execute(RAW_PLAIN, raw_params(n, prefix)).fetchone()

        return one

    in_tx: dict[str, tuple[Callable[[int, str], None], Callable[[int, str], None]]] = {
        "ours plain": (django_tx(ours_plain), django_tx(None)),
        "ours slide": (django_tx(ours_slide), django_tx(None)),
        # What every call sent before decision 205: SAVEPOINT, the write, RELEASE.
        "ours plain in a savepoint": (django_tx(in_savepoint(ours_plain)), django_tx(None)),
        "ours slide in a savepoint": (django_tx(in_savepoint(ours_slide)), django_tx(None)),
        "raw plain": (raw_tx_call(True), raw_tx_call(False)),
        "celery delay_on_commit": (
            django_tx(lambda n, prefix: celery_noop.delay_on_commit(n)),
            django_tx(None),
        ),
    }

    def timed(fn: Callable[[int, str], None], prefix: str) -> float:
        started = time.perf_counter()
        for n in range(args.calls):
            fn(n, prefix)
        return time.perf_counter() - started

    def once(fn: Callable[[int, str], None], n: int, prefix: str) -> float:
        started = time.perf_counter()
        fn(n, prefix)
        return time.perf_counter() - started

    rates: dict[str, list[float]] = {side: [] for side in AUTOCOMMIT}
    added: dict[str, list[float]] = {side: [] for side in IN_TRANSACTION}
    try:
        connection.ensure_connection()
        for side in AUTOCOMMIT:  # connections, caches, prepared statements, Redis
            timed(autocommit[side], f"warm:{side}:")
        for side in IN_TRANSACTION:
            for fn in in_tx[side]:
                timed(fn, f"warmtx:{side}:")
        for round_no in range(args.rounds):
            # Interleaved call by call (each side's next call in turn, the order rotating):
            # a load that comes and goes on a shared machine falls on every side alike.
            # Each figure is a median over the round's calls (robust to stalls).
            each: dict[str, list[float]] = {side: [] for side in AUTOCOMMIT}
            for n in range(args.calls):
                shift = n % len(AUTOCOMMIT)
                for side in AUTOCOMMIT[shift:] + AUTOCOMMIT[:shift]:
                    each[side].append(once(autocommit[side], n, f"r{round_no}:{side}:"))
            for side in AUTOCOMMIT:
                rates[side].append(1 / statistics.median(each[side]))
            with_times: dict[str, list[float]] = {side: [] for side in IN_TRANSACTION}
            base_times: dict[str, list[float]] = {side: [] for side in IN_TRANSACTION}
            for n in range(args.calls):
                shift = n % len(IN_TRANSACTION)
                for side in IN_TRANSACTION[shift:] + IN_TRANSACTION[:shift]:
                    with_call, without = in_tx[side]
                    prefix = f"r{round_no}:{side}:"
                    base_times[side].append(once(without, n, prefix))
                    with_times[side].append(once(with_call, n, prefix))
            for side in IN_TRANSACTION:
                extra = statistics.median(with_times[side]) - statistics.median(base_times[side])
                added[side].append(extra * 1e6)
            print(
                f"round {round_no + 1}: "
                + ", ".join(f"{s} {rates[s][-1]:.0f}/s" for s in AUTOCOMMIT)
                + "; in a transaction: "
                + ", ".join(f"{s} +{added[s][-1]:.0f} µs" for s in IN_TRANSACTION),
                file=sys.stderr,
                flush=True,
            )
        statements = {}
        for side, call in (("ours plain", ours_plain), ("ours slide", ours_slide)):
            with transaction.atomic(), CaptureQueriesContext(connection) as captured:
                for n in range(100):
                    call(n, "count:")
            statements[side] = len(captured.captured_queries) / 100
    finally:
        raw.close()
        raw_tx.close()
        connection.close()
        _drop_queue(args.redis)

    def ratio(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b, strict=True))

    med = statistics.median
    plain_ratio = ratio(rates["ours plain"], rates["raw plain"])
    slide_ratio = ratio(rates["ours slide"], rates["raw slide"])
    celery = added["celery delay_on_commit"]
    lines = [
        f"enqueue_calls: {args.calls:,} calls per side and round, {args.rounds} rounds, "
        f"slides over {keys} keys",
        "",
        table(
            ["autocommit", "calls/s (1 / median call) [min–max]", "µs per call"],
            [
                [
                    s,
                    f"{med(rates[s]):.0f} [{min(rates[s]):.0f}–{max(rates[s]):.0f}]",
                    f"{1e6 / med(rates[s]):.0f}",
                ]
                for s in AUTOCOMMIT
            ],
        ),
        "",
        table(
            ["in a transaction", "µs added per call median [min–max]", "statements per call"],
            [
                [
                    s,
                    f"{med(added[s]):.0f} [{min(added[s]):.0f}–{max(added[s]):.0f}]",
                    f"{statements[s]:g}" if s in statements else "",
                ]
                for s in IN_TRANSACTION
            ],
        ),
        "",
        table(
            ["target", "ratio", "needed", "verdict"],
            [
                [
                    "plain delay() / raw INSERT",
                    f"{plain_ratio:.2f}",
                    ">= 0.8",
                    "met" if plain_ratio >= 0.8 else "missed",
                ],
                [
                    "slide / raw slide-or-insert",
                    f"{slide_ratio:.2f}",
                    ">= 0.8",
                    "met" if slide_ratio >= 0.8 else "missed",
                ],
                *(
                    [
                        f"{s} added / delay_on_commit added",
                        f"{ratio(added[s], celery):.2f}",
                        "<= 1",
                        "met" if ratio(added[s], celery) <= 1 else "missed",
                    ]
                    for s in ("ours plain", "ours slide")
                ),
                *(
                    [
                        f"{s} added / {s} in a savepoint added (no target)",
                        f"{ratio(added[s], added[s + ' in a savepoint']):.2f}",
                        "",
                        "",
                    ]
                    for s in ("ours plain", "ours slide")
                ),
                [
                    "ours plain added / raw INSERT added (no target)",
                    f"{ratio(added['ours plain'], added['raw plain']):.2f}",
                    "",
                    "",
                ],
            ],
        ),
    ]
    return lines


def _drop_queue(redis_url: str) -> None:
    """Delete the Celery queue the run published to (only that key: the database is shared)."""
    import redis

    redis.Redis.from_url(redis_url).delete("enqueue_calls")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2_000, help="calls per side and round")
    parser.add_argument("--keys", type=int, default=200, help="debounce keys of the slides")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the order rotates)")
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379/9", help="Redis of Celery's broker"
    )
    add_db_arguments(parser, "bench_enqueue_calls")
    args = parser.parse_args()
    if urlsplit(args.redis).path.strip("/") in {"", "0"}:
        sys.exit("--redis must name a database other than 0")
    setup(args)
    try:
        report = run(args)
    finally:
        teardown(args)
    print()
    print("\n".join(report))


if __name__ == "__main__":
    main()
