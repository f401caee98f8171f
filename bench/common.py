"""Shared set-up of the benchmarks: a PostgreSQL database of their own, Django, timing.

Each script calls :func:`setup` before importing models: it (re)creates the
database named by ``--url`` (default ``DATABASE_URL`` with the database name
replaced, or ``postgres://postgres@127.0.0.1:5432/<default name>``), points
``bench.settings`` at it, runs ``django.setup()`` and migrates. :func:`teardown`
drops it again unless ``--keep`` was given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def add_db_arguments(parser: argparse.ArgumentParser, default_name: str) -> None:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(base)
    default = urlunsplit(parts._replace(path="/" + default_name))
    parser.add_argument(
        "--url", default=default, help=f"PostgreSQL database to create and drop (default {default})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--migration",
        default=None,
        help="migrate django_debounce only up to this migration (e.g. 0002_flow_control) "
        "to measure without later indexes",
    )


def _admin_connection(url: str) -> Any:
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True)


def setup(args: argparse.Namespace) -> str:
    """Create the database, set up Django on it and migrate; return the database name."""
    name = urlsplit(args.url).path.lstrip("/")
    if not name or name in {"postgres", "test", "template0", "template1"}:
        sys.exit(f"refusing to (re)create database {name!r}: give --url a database of your own")
    with _admin_connection(args.url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DEBOUNCE_BENCH_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.migration:
        call_command("migrate", "django_debounce", args.migration, verbosity=0)
    return name


def teardown(args: argparse.Namespace) -> None:
    from django.db import connections

    connections.close_all()
    if args.keep:
        return
    name = urlsplit(args.url).path.lstrip("/")
    with _admin_connection(args.url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def median_ms(fn: Callable[[], Any], loads: int, warmup: int = 1) -> float:
    """Run ``fn`` ``warmup`` times untimed, then ``loads`` times; return the median in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(loads):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Return a GitHub-flavoured Markdown table of ``rows``."""
    text = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in text
    ]
    return "\n".join(lines)
