"""Every command of the tutorial runs, as written, in a fresh project (issue #20).

The test reads ``docs/tutorial.md`` from the top and replays it in a temporary folder
outside the checkout: each ``console`` block's ``$ `` lines run in order in ``bash``,
and each ``python`` block marked ``<!-- file: PATH -->`` (``PATH`` relative to the folder
``startproject`` made; ``(append)`` after it appends the block to a file a command wrote)
is written there when the reader reaches it. Lines under a command without ``$ `` are
its output as the page shows it: the command's last lines of output must be those, where
``...`` in a shown line matches anything. A command that fails, or prints something
else, fails the test naming the page and the command's line.

The substitutions, and only these:

- ``path/to/django_debounce-<version>-py3-none-any.whl`` is the wheel built once per
  session (``tests/processes/conftest.py``, shared with ``test_built_wheel.py``);
- ``127.0.0.1:8000`` is ``127.0.0.1`` on a free port;
- ``python`` before the virtual environment is activated is the interpreter running the
  tests; ``source .venv/bin/activate`` puts the environment's ``bin`` first on ``PATH``
  (and sets ``VIRTUAL_ENV``) for the commands after it, and ``cd DIR`` changes the
  folder the next commands run in, as they would in the reader's shell. Every command
  otherwise runs with the clean environment of ``tests/built_wheel.py`` (nothing of the
  checkout on ``PATH``, no ``PYTHONPATH``).

A ``console`` block may carry a mark on the line above it:

- ``<!-- command: not run (why) -->``: not run. A command there that has an equivalent
  in :data:`EQUIVALENTS` (the interactive ``createsuperuser``) runs that instead;
- ``<!-- command: runs until stopped (why) -->``: started in the background; the test
  waits for what the page says happens and stops it with SIGTERM (the worker: once the
  job has run; ``runserver``: once the admin's Jobs list, read through Django's login
  form with a cookie jar, shows the job), then checks its exit status and output.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.built_wheel import REPO, STEP_TIMEOUT, VERSION, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PAGE = "docs/tutorial.md"
INSTALL_PAGE = "docs/install.md"
CHECKOUT_PLACEHOLDER = "path/to/django-debounce"
WHEEL_PLACEHOLDER = f"path/to/django_debounce-{VERSION}-py3-none-any.whl"
ADDRESS_PLACEHOLDER = "127.0.0.1:8000"
#: The superuser the test creates in place of the interactive ``createsuperuser``.
SUPERUSER = {"username": "admin", "password": "tutorial-Pa55word", "email": "admin@example.com"}
#: Commands the page marks not run, and what the test runs instead.
EQUIVALENTS = {
    "python manage.py createsuperuser": "python manage.py createsuperuser --no-input",
}
#: How long a background command may take to do what the page says (the job: its 5 s
#: debounce and a poll; runserver: to start).
WAIT = 30

FENCE = re.compile(r"^```(\w+)\s*$")
MARK = re.compile(r"^<!-- (command|file|example): (.*?) -->\s*$")


@dataclass
class Step:
    """One thing the reader does: a command (``kind="command"``) or a file to write."""

    kind: str
    line: int
    text: str
    output: list[str] = field(default_factory=list)
    mark: str | None = None
    code: str = ""
    page: str = PAGE

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def steps(page: str = PAGE) -> list[Step]:
    """The commands and files of ``page``, in order (lines 1-based)."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    found: list[Step] = []
    marks: dict[str, str] = {}
    index = 0
    while index < len(lines):
        mark, fence = MARK.match(lines[index]), FENCE.match(lines[index])
        if mark:
            marks[mark.group(1)] = mark.group(2)
            index += 1
            continue
        if fence:
            end = lines.index("```", index + 1)
            body = lines[index + 1 : end]
            if fence.group(1) == "console":
                for offset, text in enumerate(body, index + 2):
                    if text.startswith("$ "):
                        found.append(
                            Step("command", offset, text[2:], mark=marks.get("command"), page=page)
                        )
                    else:
                        assert found and found[-1].kind == "command", (
                            f"{page}:{offset}: output before a command"
                        )
                        found[-1].output.append(text)
            elif "file" in marks:
                code = "\n".join(body) + "\n"
                found.append(Step("file", index + 1, marks["file"], code=code, page=page))
            index = end
        elif lines[index].strip():
            marks = {}
        index += 1
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shown_output_matches(shown: list[str], printed: str) -> bool:
    """Whether the last lines ``printed`` are the ``shown`` ones (``...`` matches anything)."""
    tail = [line for line in printed.splitlines() if line.strip()][-len(shown) :]
    patterns = [re.escape(line).replace(re.escape("..."), ".*") for line in shown]
    return len(tail) == len(shown) and all(
        re.fullmatch(pattern, line) for pattern, line in zip(patterns, tail, strict=True)
    )


class Reader:
    """A shell that follows the page: its folder, its environment, its background commands."""

    def __init__(self, home: Path, substitutions: dict[str, str]) -> None:
        self.home = home
        self.cwd = home
        self.address = f"127.0.0.1:{free_port()}"
        self.substitutions = {**substitutions, ADDRESS_PLACEHOLDER: self.address}
        shim = home.parent / "shim"
        shim.mkdir()
        (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (shim / "python").chmod(0o755)
        self.env = clean_env()
        self.env["PATH"] = f"{shim}{os.pathsep}{self.env['PATH']}"
        self.project: Path | None = None

    def substitute(self, text: str) -> str:
        for placeholder, value in self.substitutions.items():
            text = text.replace(placeholder, value)
        return text

    def command(self, step: Step) -> None:
        text = step.text
        if text.startswith("cd "):
            self.cwd = (self.cwd / text[3:].strip()).resolve()
            assert self.cwd.is_dir(), f"{step.where}: `{text}`: no folder {self.cwd}"
            return
        if text.strip() == "source .venv/bin/activate":
            venv = self.cwd / ".venv"
            assert (venv / "bin" / "python").exists(), f"{step.where}: `{text}`: no {venv}"
            self.env["VIRTUAL_ENV"] = str(venv)
            self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"
            return
        if step.mark is not None and step.mark.startswith("not run ("):
            if text in EQUIVALENTS:
                self.run(step, EQUIVALENTS[text], extra_env=superuser_env())
            return
        if step.mark is not None and step.mark.startswith("runs until stopped ("):
            self.background(step)
            return
        assert step.mark is None, f"{step.where}: unknown mark {step.mark!r}"
        self.run(step, text)

    def run(self, step: Step, text: str, extra_env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            ["bash", "-c", self.substitute(text)],
            cwd=self.cwd,
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        self.check(step, result.returncode, result.stdout, result.stderr)
        if "startproject" in text:
            self.project = self.cwd / text.split()[-1]
        return result.stdout

    def check(self, step: Step, returncode: int, stdout: str, stderr: str) -> None:
        report = f"--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}"
        if returncode != 0:
            pytest.fail(f"{step.where}: `{step.text}` exited {returncode}\n{report}")
        if step.output and not shown_output_matches(step.output, stdout + stderr):
            pytest.fail(
                f"{step.where}: `{step.text}` printed something else than the page shows:\n"
                + "\n".join(step.output)
                + f"\n{report}"
            )

    def background(self, step: Step) -> None:
        log = self.home.parent / f"background-{step.line}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                ["bash", "-c", self.substitute(step.text)],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            if "run_debounce_worker" in step.text:
                wait_for_the_job(self.cwd / "db.sqlite3", process, step)
            elif "runserver" in step.text:
                read_the_admin(self.address, process, step)
            else:
                pytest.fail(f"{step.where}: no test knows when `{step.text}` is done")
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            try:
                returncode = process.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                returncode = process.wait()
        output = log.read_text()
        # SIGTERM ends runserver (-15) but the worker exits 0 after a clean stop.
        if "runserver" in step.text and returncode == -signal.SIGTERM:
            returncode = 0
        self.check(step, returncode, output, "")

    def write(self, step: Step) -> None:
        assert self.project is not None, f"{step.where}: a file before the project exists"
        relative, _, flags = step.text.partition(" ")
        path = self.project / relative
        if flags == "(append)":
            assert path.exists(), f"{step.where}: nothing to append to at {path}"
            with path.open("a", encoding="utf-8") as file:
                file.write("\n" + step.code)
        else:
            assert not flags, f"{step.where}: unknown file flags {flags!r}"
            path.write_text(step.code, encoding="utf-8")


def superuser_env() -> dict[str, str]:
    return {f"DJANGO_SUPERUSER_{name.upper()}": value for name, value in SUPERUSER.items()}


def wait_for_the_job(database: Path, process: subprocess.Popen, step: Step) -> None:
    """Wait until the one job of the burst has finished, as the page says it will."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and process.poll() is None:
        with sqlite3.connect(database, timeout=20) as db:
            rows = db.execute("SELECT status FROM django_debounce_job").fetchall()
        if rows and all(status in ("SUCCESSFUL", "FAILED") for (status,) in rows):
            return
        time.sleep(0.2)
    pytest.fail(f"{step.where}: `{step.text}` ran no job in {WAIT} s (exit {process.poll()})")


def read_the_admin(address: str, process: subprocess.Popen, step: Step) -> None:
    """Log in through the admin's login form and find the job on the Jobs list."""
    base = f"http://{address}"
    deadline = time.monotonic() + WAIT
    while True:
        try:
            socket.create_connection(address.split(":"), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"{step.where}: `{step.text}` is not serving on {address}")
            time.sleep(0.2)
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    changelist = "/admin/django_debounce/job/"
    form = opener.open(f"{base}/admin/login/?next={changelist}", timeout=WAIT).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, f"{step.where}: no CSRF token in the admin's login form"
    fields = {
        "csrfmiddlewaretoken": token.group(1),
        "username": SUPERUSER["username"],
        "password": SUPERUSER["password"],
        "next": changelist,
    }
    response = opener.open(
        urllib.request.Request(
            f"{base}/admin/login/?next={changelist}",
            data=urllib.parse.urlencode(fields).encode(),
            headers={"Referer": f"{base}/admin/login/"},
        ),
        timeout=WAIT,
    )
    page = response.read().decode()
    assert urllib.parse.urlparse(response.url).path == changelist, (
        f"{step.where}: the login did not reach the Jobs list ({response.url})"
    )
    assert "reports.tasks.build_report" in page, f"{step.where}: the job is not on the list"
    assert f"{changelist}1/change/" in page, f"{step.where}: the job's link is not on the list"
    assert "SUCCESSFUL" in page.upper(), f"{step.where}: the job's status is not on the list"


def test_the_page_has_its_commands_and_files():
    found = steps()
    commands = [step.text for step in found if step.kind == "command"]
    files = [step.text for step in found if step.kind == "file"]
    assert "django-admin startproject mysite" in commands
    assert "python manage.py run_debounce_worker" in commands
    assert files == ["mysite/settings.py (append)", "reports/models.py", "reports/tasks.py"]
    for step in found:
        if step.kind == "command" and step.mark is not None:
            assert step.mark.startswith(("not run (", "runs until stopped (")), step.where


def test_every_command_of_the_tutorial_runs_as_written(dist, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    reader = Reader(home, {WHEEL_PLACEHOLDER: str(dist["wheel"])})
    for step in steps():
        if step.kind == "command":
            reader.command(step)
        else:
            reader.write(step)
    # What the page says happened, read from the project's own database.
    assert reader.project is not None
    with sqlite3.connect(reader.project / "db.sqlite3") as db:
        jobs = db.execute(
            "SELECT task_name, status, kwargs, enqueue_count, attempts FROM django_debounce_job"
        ).fetchall()
    assert jobs == [("reports.tasks.build_report", "SUCCESSFUL", '{"user_id": 7}', 20, 1)]


def copy_of_the_checkout(destination: Path) -> Path:
    """The files of the checkout the sdist takes (tracked or new, not ignored), copied to
    ``destination``: ``python -m build`` writes its ``dist/`` there, not into the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", "pyproject.toml", "django_debounce"]
        + ["docs", "README.md", "LICENSE", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    return destination


def test_the_install_page_installs_from_a_checkout_and_from_the_wheel_it_builds(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    checkout = copy_of_the_checkout(tmp_path / "django-debounce")
    reader = Reader(home, {CHECKOUT_PLACEHOLDER: str(checkout)})
    found = steps(INSTALL_PAGE)
    assert any("python -m build" in step.text for step in found)
    for step in found:
        assert step.kind == "command", f"{step.where}: the install page writes no file"
        reader.command(step)
    assert (checkout / "dist" / f"django_debounce-{VERSION}-py3-none-any.whl").is_file()
