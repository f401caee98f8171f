"""The example project: settings, admin, and the demo commands from a fresh checkout.

The subprocess tests run ``python manage.py …`` exactly as the README does,
on a fresh SQLite file in a temporary directory (``DEBOUNCE_EXAMPLE_SQLITE``),
whatever database the rest of the suite uses.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from django.test import override_settings

from example_project.docs.events import builtin_events
from tests.processes.test_replay_events import MAX_WAIT, W, expected_runs

REPO = Path(__file__).resolve().parents[2]


def example_settings(monkeypatch, **env: str):
    """Import ``example_project.settings`` afresh under ``env`` (it reads the environment)."""
    for name in ("DATABASE_URL", "DEBOUNCE_EXAMPLE_SQLITE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    module = importlib.import_module("example_project.settings")
    return importlib.reload(module)


def test_example_settings_default_to_a_sqlite_file_in_immediate_mode(monkeypatch):
    conf = example_settings(monkeypatch)
    db = conf.DATABASES["default"]
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["NAME"] == str(REPO / "example_project" / "db.sqlite3")
    assert db["OPTIONS"] == {"transaction_mode": "IMMEDIATE", "timeout": 20}
    assert conf.USE_TZ is True
    assert {"django.contrib.admin", "django_debounce", "example_project.docs"} <= set(
        conf.INSTALLED_APPS
    )


def test_example_settings_use_database_url(monkeypatch):
    conf = example_settings(monkeypatch, DATABASE_URL="postgres://demo:pw@db.example:5433/docs")
    db = conf.DATABASES["default"]
    assert (db["ENGINE"], db["NAME"], db["USER"], db["HOST"], db["PORT"]) == (
        "django.db.backends.postgresql",
        "docs",
        "demo",
        "db.example",
        5433,
    )
    conf = example_settings(monkeypatch, DATABASE_URL="sqlite:////tmp/other.sqlite3")
    assert conf.DATABASES["default"]["OPTIONS"] == {"transaction_mode": "IMMEDIATE", "timeout": 20}


@pytest.mark.django_db
@override_settings(ROOT_URLCONF="example_project.urls")
def test_example_admin_is_enabled(client, admin_user):
    assert client.get("/admin/login/").status_code == 200
    client.force_login(admin_user)
    for url in ("/admin/docs/docbuild/", "/admin/django_debounce/job/"):
        assert client.get(url).status_code == 200, url


def example_env(tmp_path: Path) -> dict[str, str]:
    """The environment of ``python manage.py …`` on a fresh SQLite file in ``tmp_path``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH"}
    }
    env["DEBOUNCE_EXAMPLE_SQLITE"] = str(tmp_path / "db.sqlite3")
    return env


def manage(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=example_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def manage_in_terminal(
    tmp_path: Path, *args: str, columns: int = 100, timeout: float = 300
) -> tuple[int, str]:
    """Run ``python manage.py …`` on a pseudo-terminal of ``columns`` x 30, as a person would.

    Progress bars and colours switch on only when stdout/stderr are a terminal, so a plain
    ``subprocess.run`` (pipes) never shows what a person's terminal shows. Returns the exit
    code and everything written to the terminal (``\r\n`` line ends, ANSI codes and all).
    """
    env = example_env(tmp_path)
    env["TERM"] = "xterm-256color"
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=timeout), b"".join(chunks).decode("utf-8", "replace")


def test_demo_in_a_terminal_draws_its_progress_bar_and_exits_0(tmp_path):
    """The README's first command as a person runs it (tqdm on, time-machine travelling).

    Regression: on a terminal the bar was reset on the frozen clock before any travel and
    ``replay_events`` died with ``ValueError: Not currently time-travelling``.
    """
    assert manage(tmp_path, "migrate").returncode == 0
    code, screen = manage_in_terminal(tmp_path, "replay_events", "--limit", "120")
    assert code == 0, screen
    assert "120/120" in screen, screen  # the bar was drawn and completed
    assert "Traceback" not in screen, screen
    assert summary_value(screen.replace("\r", ""), "events") == "120"


def summary_value(stdout: str, label: str) -> str:
    for line in stdout.splitlines():
        if line.strip().startswith(label):
            return line.strip()[len(label) :].split()[0]
    raise AssertionError(f"no {label!r} line in:\n{stdout}")


@pytest.mark.slow
def test_fresh_checkout_migrate_then_replay_events(tmp_path):
    """The README's demo: ``python manage.py migrate && python manage.py replay_events``."""
    migrate = manage(tmp_path, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    check = manage(tmp_path, "check")
    assert check.returncode == 0 and "no issues" in check.stdout, check.stdout + check.stderr
    done = manage(tmp_path, "replay_events", "--no-progress")
    assert done.returncode == 0, done.stderr
    expected = expected_runs([(e.timestamp, e.path) for e in builtin_events()], W, MAX_WAIT)
    assert summary_value(done.stdout, "events") == "400"
    assert summary_value(done.stdout, "runs") == str(expected.runs)
    assert summary_value(done.stdout, "runs forced by the max wait") == str(expected.forced)
    assert summary_value(done.stdout, "DocBuild rows") == str(expected.runs)
    again = manage(tmp_path, "replay_events", "--no-progress", "--limit", "50")
    assert again.returncode == 0, again.stderr
    assert f"deleted {expected.runs} earlier job(s)" in again.stdout


@pytest.mark.slow
def test_real_time_replay_with_a_worker_subprocess_on_sqlite(tmp_path):
    """``--real-time`` on SQLite: 30 built-in events at 1,250x (each call ≥ 288 ms from a deadline)."""
    assert manage(tmp_path, "migrate").returncode == 0
    speed = 1250.0
    done = manage(
        tmp_path,
        "replay_events",
        "--real-time",
        "--limit",
        "30",
        "--speed",
        str(speed),
        "--no-progress",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert summary_value(out, "events") == "30"
    assert summary_value(out, "open windows per key, max") == "1"
    assert summary_value(out, "worker exit status") == "0"
    assert "no key ever held two READY windows" in out
    assert summary_value(out, "windows opened (jobs)") == summary_value(out, "runs")
    assert summary_value(out, "DocBuild rows") == summary_value(out, "runs")
    expected = expected_runs([(e.timestamp, e.path) for e in builtin_events(30)], W, MAX_WAIT)
    lag = float(summary_value(out, "producer lag, worst")) / 1000
    lateness = float(summary_value(out, "worker lateness, worst")) / 1000
    if not expected.exact_in_real_time(speed, lag, lateness):
        # The invariants above hold whatever the timing; exact counts need the timing to
        # keep every call on the trace's side of its deadline (not on a loaded machine).
        print(f"exact comparison not applicable: lag {lag} s, lateness {lateness} s")
        return
    assert summary_value(out, "runs") == str(expected.runs)
    assert summary_value(out, "runs forced by the max wait") == str(expected.forced)
