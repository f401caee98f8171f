"""The package's commands on a database that is missing, unreachable or not migrated.

A new user who forgot ``migrate`` gets one line naming the fix, not a driver
traceback (decision 130; ``django_debounce.management.database_ready``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections

from django_debounce.contrib.prometheus.collector import DatabaseCollector
from django_debounce.management.database_ready import require_tables
from tests.conftest import is_postgres, require_service

# The tests on extra aliases run outside a test transaction (no ``django_db``: Django's
# test case would refuse an alias it was not set up with); ``django_db_blocker`` lets them in.


def _add_alias(alias: str, conf: dict) -> Iterator[str]:
    connections.settings[alias] = connections.configure_settings(
        {**connections.settings, alias: conf}
    )[alias]
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections.settings[alias]
        if hasattr(connections._connections, alias):
            delattr(connections._connections, alias)


@pytest.fixture
def bare(tmp_path: Path, django_db_blocker) -> Iterator[str]:
    """A database alias on an empty SQLite file: reachable, never migrated."""
    with django_db_blocker.unblock():
        conf = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "bare.sqlite3")}
        yield from _add_alias("bare", conf)


@pytest.fixture
def unreachable(tmp_path: Path, django_db_blocker) -> Iterator[str]:
    """A database alias whose SQLite file cannot be opened (its directory does not exist)."""
    with django_db_blocker.unblock():
        conf = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "no" / "x.sqlite3")}
        yield from _add_alias("gone", conf)


@pytest.mark.parametrize(
    "command, options",
    [
        ("debounce_status", {}),
        ("debounce_status", {"format": "json"}),
        ("prune_debounce_jobs", {"older_than": "7d"}),
        ("prune_debounce_jobs", {"older_than": "7d", "dry_run": True}),
    ],
)
def test_an_unmigrated_database_asks_for_migrate(bare, command, options):
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(command, database=bare, stdout=out, stderr=io.StringIO(), **options)
    message = str(caught.value)
    assert message == "no django_debounce tables in database 'bare': run python manage.py migrate."
    assert out.getvalue() == ""


@pytest.mark.django_db
def test_the_check_runs_one_query_and_accepts_a_migrated_database(django_assert_num_queries):
    with django_assert_num_queries(1):
        require_tables("default")


@pytest.mark.parametrize(
    "command, options", [("debounce_status", {}), ("prune_debounce_jobs", {"older_than": "7d"})]
)
def test_an_unknown_alias_lists_the_configured_ones(command, options):
    with pytest.raises(CommandError) as caught:
        call_command(command, database="nope", **options)
    assert str(caught.value) == "--database 'nope' is not in DATABASES; configured: 'default'."


def test_an_unreachable_database_names_the_alias_and_the_driver_line(unreachable):
    with pytest.raises(CommandError) as caught:
        call_command("debounce_status", database=unreachable)
    assert str(caught.value) == "database 'gone' cannot be reached: unable to open database file"


@pytest.mark.postgres
def test_a_postgres_database_that_does_not_exist(django_db_blocker):
    require_service(is_postgres(), "needs PostgreSQL: run python3 dev.py test --db postgres")
    conf = {**settings.DATABASES["default"], "NAME": "opsfix_no_such_database"}
    conf.pop("TEST", None)
    missing = contextmanager(_add_alias)("missing", conf)
    with django_db_blocker.unblock(), missing as alias, pytest.raises(CommandError) as caught:
        call_command("prune_debounce_jobs", older_than="7d", database=alias)
    message = str(caught.value)
    assert message.startswith("database 'missing' cannot be reached: ")
    assert 'database "opsfix_no_such_database" does not exist' in message
    assert "\n" not in message


def test_the_metrics_warning_on_an_unmigrated_database_suggests_migrate(bare, caplog):
    with caplog.at_level(logging.WARNING, logger="django_debounce.metrics"):
        families = list(DatabaseCollector(using=bare).collect())
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [
        ("django_debounce_collector_up", [0])
    ]
    assert "python manage.py migrate" in caplog.records[-1].getMessage()


def test_the_metrics_warning_without_a_table_problem_has_no_hint(unreachable, caplog):
    with caplog.at_level(logging.WARNING, logger="django_debounce.metrics"):
        list(DatabaseCollector(using=unreachable).collect())
    assert "migrate" not in caplog.records[-1].getMessage()
