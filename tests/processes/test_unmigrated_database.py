"""A new user runs the commands before ``migrate``: one line and exit 1, no traceback.

Real processes because the point is what a terminal shows: ``manage.py``'s
exit status and stderr (decision 130). The database is an empty one on the
suite's database server (``tests.unmigrated``): a fresh SQLite file, or in the
PostgreSQL and MariaDB runs a fresh database beside the test database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unmigrated import database_url, empty_database

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def fresh_env(tmp_path: Path, django_db_setup, django_db_blocker) -> Iterator[dict[str, str]]:
    """The environment of a ``manage.py`` whose default database was never migrated."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(REPO))
    with django_db_blocker.unblock(), empty_database(tmp_path) as conf:
        url = database_url(conf)
        if url is None:
            env["DEBOUNCE_TEST_SQLITE"] = conf["NAME"]
        else:
            env["DATABASE_URL"] = url
        yield env


@pytest.mark.parametrize(
    "argv",
    [
        ["run_debounce_worker", "--burst"],
        ["debounce_status", "--format", "json"],
        ["prune_debounce_jobs", "--older-than", "7d"],
        ["retry_dead_letters"],
        ["retry_dead_letters", "--dry-run", "--task", "no.such.task"],
    ],
)
def test_a_command_on_an_unmigrated_database_prints_one_line(fresh_env, argv: list[str]):
    done = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        env=fresh_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == (
        "CommandError: no django_debounce tables in database 'default':"
        " run python manage.py migrate.\n"
    )


def test_migrate_on_a_fresh_database_warns_nothing(fresh_env):
    """W011 (the NOTIFY triggers missing) does not apply before migration 0007 has run."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--no-input"],
        env=fresh_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Applying django_debounce.0007_wakeup_notify... OK" in done.stdout
    assert "WARNINGS" not in done.stdout + done.stderr, done.stdout + done.stderr
