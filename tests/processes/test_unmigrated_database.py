"""A new user runs the commands before ``migrate``: one line and exit 1, no traceback.

Real processes because the point is what a terminal shows: ``manage.py``'s
exit status and stderr (decision 130). The database is a fresh, empty SQLite
file, so this needs no service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize(
    "argv",
    [
        ["run_debounce_worker", "--burst"],
        ["debounce_status", "--format", "json"],
        ["prune_debounce_jobs", "--older-than", "7d"],
    ],
)
def test_a_command_on_an_unmigrated_database_prints_one_line(tmp_path: Path, argv: list[str]):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DEBOUNCE_TEST_SQLITE=str(tmp_path / "fresh.sqlite3"),
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        env=env,
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
