"""Shared fixtures.

Service-backed tests: a test marked ``postgres`` runs only when the default
database is PostgreSQL (``DATABASE_URL=postgres://…``); one marked
``row_locks`` (races between workers or producers, ``SKIP LOCKED``, a lock held
by another connection) runs on PostgreSQL and on MariaDB/MySQL
(``DATABASE_URL=mysql://…``). Elsewhere such a test is skipped; with
``DEBOUNCE_REQUIRE_SERVICES=1`` (set by ``.ci/run``) every skip of such a test
is a failure, so a green CI means the real database was exercised. CI
deselects by marker instead of skipping: ``not postgres and not row_locks`` in
its SQLite cells, ``not postgres`` in its MariaDB cell.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection

from django_debounce import signals

REQUIRE_SERVICES = os.environ.get("DEBOUNCE_REQUIRE_SERVICES") == "1"

#: The fixed instant T of the field reports.
T = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def require_service(available: bool, reason: str) -> None:
    """Skip the calling test when a service is missing, or fail under DEBOUNCE_REQUIRE_SERVICES=1."""
    if available:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing (DEBOUNCE_REQUIRE_SERVICES=1): {reason}")
    pytest.skip(reason)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def has_row_locks() -> bool:
    """True on PostgreSQL and MariaDB/MySQL: row locks, ``SKIP LOCKED``, concurrent writers."""
    return connection.vendor in ("postgresql", "mysql")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print pytest-randomly's seed again after the results (above the short summary), also under ``-q``.

    pytest-randomly prints it first, in the header, which ``-q`` hides and a long
    run scrolls away; this line keeps it next to the failures, to replay the order.
    """
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"random order: replay it with --randomly-seed={seed}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres"):
        require_service(is_postgres(), "needs PostgreSQL: run python3 dev.py test --db postgres")
    if item.get_closest_marker("mariadb"):
        require_service(
            connection.vendor == "mysql",
            "needs MariaDB/MySQL: run python3 dev.py test --db mariadb",
        )
    if item.get_closest_marker("row_locks"):
        require_service(
            has_row_locks(),
            "needs a database server with row locks: run python3 dev.py test --db postgres "
            "(or --db mariadb)",
        )


@pytest.fixture
def clock() -> Iterator[Callable[..., dt.datetime]]:
    """Freeze the package's clock at T; call ``clock(seconds=…)``/``clock(at=…)`` to move it.

    Returns the new instant. Time never ticks on its own (time-machine, §4.7).
    """
    with time_machine.travel(T, tick=False) as traveller:

        def move(*, at: dt.datetime | None = None, **delta: float) -> dt.datetime:
            target = at if at is not None else T + dt.timedelta(**delta)
            traveller.move_to(target)
            return target

        yield move


def run_burst(**options: Any) -> None:
    """``run@now``: run every job due now through the real worker command."""
    call_command("run_debounce_worker", burst=True, **options)


@pytest.fixture
def burst() -> Callable[..., None]:
    return run_burst


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess (worker or producer) that must use this test's database.

    Call it inside a test: the database NAME is then the test database's.
    """
    from pathlib import Path
    from urllib.parse import quote

    from django.conf import settings

    env = dict(os.environ)
    db = settings.DATABASES["default"]
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    if connection.vendor == "postgresql":
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        user = db.get("USER") or "postgres"
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{connection.settings_dict['NAME']}"
    elif connection.vendor == "mysql":
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 3306
        user = db.get("USER") or "root"
        password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
        env["DATABASE_URL"] = (
            f"mysql://{user}{password}@{host}:{port}/{connection.settings_dict['NAME']}"
        )
    else:
        env.pop("DATABASE_URL", None)
        env["DEBOUNCE_TEST_SQLITE"] = str(connection.settings_dict["NAME"])
    env.update(extra)
    return env


@pytest.fixture
def signal_log():
    """Record every django_debounce signal as ``(name, kwargs, job status when sent)``."""
    seen: list[tuple[str, dict[str, Any], str]] = []
    receivers = []
    for name in ("job_enqueued", "job_started", "job_finished", "job_dead_lettered"):

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal")
            seen.append((name, {"sender": sender, **kwargs}, kwargs["job"].status))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((getattr(signals, name), receiver))
    yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


@pytest.fixture
def otel_spans() -> Iterator[Any]:
    """Trace django_debounce with an SDK provider of this test's; yield its in-memory exporter.

    The exporter's ``provider`` attribute is that provider (for the test's own parent spans).

    The provider is given through :func:`django_debounce.tracing.use_tracer_provider`, not
    set globally (OpenTelemetry allows that once per process), and taken back after the test.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_debounce.tracing import use_tracer_provider

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.provider = provider  # type: ignore[attr-defined]
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture(autouse=True)
def _celery_successes_written() -> Iterator[None]:
    """Write the successes a test's in-process Celery task left waiting, and close the writer.

    Any test that runs a handed-off job in this process (``run_handed_off``, the
    ``run_job`` task; tests/db/contrib/celery, tests/db/tracing, ...) may start the
    process's batched-success writer thread (decision 215), which keeps a connection
    of its own: the test database is flushed or dropped next, so the thread must not
    hold a session to it. Nothing to do when the module was never imported.
    """
    yield
    module = sys.modules.get("django_debounce.contrib.celery.batched_successes")
    if module is not None:
        module.process_successes.stop()
