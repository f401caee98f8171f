"""An enqueue on a database the package's migrations never ran on (decision 158).

The driver's error (``ProgrammingError`` on PostgreSQL and MariaDB,
``OperationalError`` on SQLite) becomes the package's ``NotMigratedError``,
saying to run ``migrate``. The database is an empty one beside the test database
(``tests.unmigrated``), so this runs on SQLite and, in CI, on PostgreSQL and
MariaDB; the tests run outside a test transaction (``django_db_blocker``), as in
test_command_database_ready.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import DatabaseError, connections, transaction
from django.test import override_settings

from django_debounce import debounced_task, enqueue, enqueue_many, task
from django_debounce.exceptions import DebounceError, NotMigratedError
from django_debounce.schema_ready import package_tables
from tests.unmigrated import empty_database

ALIAS = "bare"


@task(name="tests.bare.plain")
def plain(x: int) -> None:
    pass


@debounced_task(name="tests.bare.windowed", debounce="10s", debounce_max_wait="1m")
def windowed(x: int) -> None:
    pass


class ToBare:
    """Route every write to the empty database (``delay()`` takes no alias)."""

    def db_for_write(self, model: object, **hints: object) -> str:
        return ALIAS

    def db_for_read(self, model: object, **hints: object) -> str:
        return ALIAS


@pytest.fixture
def bare(tmp_path: Path, django_db_setup, django_db_blocker) -> Iterator[str]:
    with django_db_blocker.unblock(), empty_database(tmp_path) as conf:
        connections.settings[ALIAS] = connections.configure_settings(
            {**connections.settings, ALIAS: conf}
        )[ALIAS]
        try:
            with override_settings(DATABASE_ROUTERS=[ToBare()]):
                yield ALIAS
        finally:
            connections[ALIAS].close()
            del connections.settings[ALIAS]
            if hasattr(connections._connections, ALIAS):
                delattr(connections._connections, ALIAS)


MESSAGE = (
    "{what} failed: database 'bare' has no table django_debounce_deadletter (the "
    "django_debounce migrations have not run there): run python manage.py migrate."
)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: plain.delay(1), "tests.bare.plain"),
        (lambda: windowed.delay(1), "tests.bare.windowed"),
        (lambda: plain.apply_async((1,), countdown=5), "tests.bare.plain"),
        (lambda: enqueue("tests.bare.plain", args=(1,)), "tests.bare.plain"),
        (lambda: enqueue("tests.bare.unregistered", kwargs={"x": 1}), "tests.bare.unregistered"),
    ],
    ids=["delay", "debounced", "apply_async", "enqueue", "enqueue_unregistered"],
)
def test_an_enqueue_before_migrate_says_to_run_migrate(bare, call, name):
    with pytest.raises(NotMigratedError) as raised:
        call()
    assert isinstance(raised.value, DebounceError) and isinstance(raised.value, DatabaseError)
    assert str(raised.value) == MESSAGE.format(what=f"enqueue of {name!r}")
    cause = raised.value.__cause__
    assert isinstance(cause, DatabaseError) and not isinstance(cause, NotMigratedError)


def test_enqueue_many_before_migrate_says_to_run_migrate(bare):
    with pytest.raises(NotMigratedError) as raised:
        enqueue_many([(plain, (1,)), (windowed, (2,))], using=bare)
    assert str(raised.value) == MESSAGE.format(what="enqueue_many")


def test_the_callers_transaction_stays_usable(bare):
    """Inside ``atomic()`` the failed write was a savepoint: the transaction goes on (PostgreSQL too)."""
    with transaction.atomic(using=bare):
        with pytest.raises(NotMigratedError):
            windowed.delay(3)
        with connections[bare].cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)


def test_another_database_error_is_left_alone(bare):
    """With every table there (wrong columns), the driver's own error is raised unchanged."""
    with connections[bare].cursor() as cursor:
        for table in package_tables():
            cursor.execute(f"CREATE TABLE {table} (id INTEGER)")
    try:
        with pytest.raises(DatabaseError) as raised:
            plain.delay(4)
        assert not isinstance(raised.value, NotMigratedError)
    finally:
        with connections[bare].cursor() as cursor:
            for table in package_tables():
                cursor.execute(f"DROP TABLE {table}")
