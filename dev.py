#!/usr/bin/env python3
"""Task runner for django-debounce: one command per job, standard library only.

    python3 dev.py demo                 # run the demo (SQLite; DATABASE_URL for PostgreSQL)
    python3 dev.py test                 # run the tests on SQLite
    python3 dev.py test -- -k b01       # pass arguments through to pytest
    python3 dev.py test -- tests/unit   # one tier: tests/unit, tests/db, tests/processes
    python3 dev.py test -- --randomly-seed=N   # replay a random order (-p no:randomly: off)
    python3 dev.py test --db postgres -m "not slow"
    python3 dev.py test --db mariadb    # MariaDB/MySQL (installs mysqlclient into the venv)
    python3 dev.py test --python python3.12 --django "Django>=6.1,<6.2"
    python3 dev.py lint                 # ruff, ruff format --check, mypy, makemigrations --check
    python3 dev.py bench claim -- --jobs 5000   # a benchmark of bench/ (PostgreSQL; bench/README.md)
    python3 dev.py bench suite                  # every benchmark, beside the peers (bench/README.md)
    python3 dev.py docs                 # build the documentation site into .artifacts/docs (-W)

Each command makes a virtual environment if it is missing (``.venv``; with
``--python``/``--django`` one per pair, e.g. ``.venv-py3.12-dj6.1``), upgrades
pip in it, and installs the package editable with the dependency groups of
``pyproject.toml`` the command needs. The venv is stamped with a hash of
``pyproject.toml``, the interpreter and the Django requirement, so later runs
skip the install until one of those changes.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MIN_PYTHON = (3, 11)
#: ``pip install --group`` (PEP 735) arrived in pip 25.1.
MIN_PIP = "pip>=25.1"
#: ``--db`` name -> (default DATABASE_URL, URL schemes that choose that database).
DATABASE_URLS = {
    "postgres": ("postgres://postgres@127.0.0.1:5432/test", ("postgres", "postgresql", "pgsql")),
    "mariadb": ("mysql://root@127.0.0.1:3306/test", ("mysql", "mariadb")),
}
STAMP = ".dev-py-stamp.json"
BIN = "Scripts" if os.name == "nt" else "bin"

#: Dependency groups (pyproject.toml [dependency-groups]) each command needs.
GROUPS = {
    "demo": ["demo"],
    "test": ["test"],
    "lint": ["lint"],
    "bench": ["test", "bench"],
    "docs": ["docs"],
}
#: Extra dependency groups a ``--db`` needs (its driver).
DB_GROUPS = {"mariadb": ["mysql"]}


def say(message: str) -> None:
    print(f"dev.py: {message}", flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True) -> int:
    """Run ``cmd`` in the repository root; return its exit code (exit on failure if ``check``)."""
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if check and code != 0:
        say(f"command failed with exit code {code}: {' '.join(cmd)}")
        sys.exit(code)
    return code


# -- interpreters and venvs ----------------------------------------------------------


def _runs(python: str) -> str | None:
    """Return ``X.Y`` of ``python`` if it starts, else ``None``."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(name: str | None) -> tuple[str, str]:
    """Return ``(executable, "X.Y")`` for ``--python`` (a name like ``python3.12`` or a path).

    A pyenv shim that refuses a version which is installed but not selected
    (``pyenv: python3.12: command not found``) is bypassed by looking in
    ``$PYENV_ROOT/versions`` directly.
    """
    if name is None:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if sys.version_info < MIN_PYTHON:
            sys.exit(f"dev.py needs Python {'.'.join(map(str, MIN_PYTHON))}+, this is {version}.")
        return sys.executable, version
    candidates = [name] if os.sep in name else [shutil.which(name) or name]
    match = re.fullmatch(r"(?:python)?(\d+\.\d+)", os.path.basename(name))
    if match:
        wanted = match.group(1)
        pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        found = glob.glob(os.path.join(pyenv_root, "versions", f"{wanted}.*", BIN, "python3"))
        candidates += sorted(found, key=_version_key, reverse=True)
        candidates += [f"/usr/local/bin/python{wanted}", f"/usr/bin/python{wanted}"]
    for candidate in candidates:
        version = _runs(candidate)
        if version is not None:
            if match and version != match.group(1):
                continue
            return candidate, version
    sys.exit(f"dev.py: cannot find a working interpreter for --python {name}")


def _version_key(path: str) -> tuple[int, ...]:
    numbers = re.findall(r"versions/(\d+)\.(\d+)\.(\d+)", path)
    return tuple(int(n) for n in numbers[0]) if numbers else (0,)


def venv_dir(python: str | None, python_version: str, django: str | None) -> Path:
    """Return the venv for this interpreter/Django pair: ``.venv`` by default."""
    if python is None and django is None:
        return ROOT / ".venv"
    name = f".venv-py{python_version}"
    if django:
        found = re.search(r"\d+(?:\.\d+)?", django)
        label = found.group(0) if found else hashlib.sha256(django.encode()).hexdigest()[:6]
        name += f"-dj{label}"
    return ROOT / name


def ensure_venv(opts: argparse.Namespace, groups: list[str]) -> Path:
    """Create/refresh the venv for ``opts`` with ``groups`` installed; return its python."""
    base_python, version = find_python(opts.python)
    venv = venv_dir(opts.python, version, opts.django)
    python = venv / BIN / "python"
    key = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + f"\0{version}\0{opts.django or ''}".encode()
    ).hexdigest()
    stamp_file = venv / STAMP
    try:
        stamp = json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        stamp = {}
    have = set(stamp.get("groups", [])) if stamp.get("key") == key else set()
    missing = sorted(set(groups) - have)
    if python.exists() and not missing:
        return python

    started = time.monotonic()
    quiet = ["--quiet"] if os.environ.get("CI") else []
    pip = [str(python), "-m", "pip", "install", *quiet]
    if have and python.exists():
        # Same pyproject, interpreter and Django: add only the groups this command lacks.
        say(f"installing into {venv.name}: groups {', '.join(missing)}")
    else:
        if not python.exists():
            say(f"creating {venv.name} with {base_python} (Python {version})")
            run([base_python, "-m", "venv", str(venv)])
        run([*pip, "--upgrade", MIN_PIP])
        say(f"installing into {venv.name}: the package (editable), groups {', '.join(missing)}")
        pip.append("--editable=.")
    cmd = list(pip)
    for group in missing:
        cmd += ["--group", group]
    if opts.django:
        cmd.append(opts.django)
    run(cmd)
    want = sorted(have | set(missing))
    stamp_file.write_text(json.dumps({"key": key, "groups": want}))
    info = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, django; print(sys.version.split()[0], django.__version__)",
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    if len(info) == 2:
        say(
            f"{venv.name}: Python {info[0]}, Django {info[1]} "
            f"(set up in {time.monotonic() - started:.0f}s)"
        )
    return python


# -- commands --------------------------------------------------------------------------


def cmd_demo(opts: argparse.Namespace, extra: list[str]) -> int:
    """Migrate the example project's database and replay the recorded events."""
    python = str(ensure_venv(opts, GROUPS["demo"]))
    run([python, "manage.py", "migrate", "--verbosity", "1"])
    return run([python, "manage.py", "replay_events", *extra], check=False)


def cmd_test(opts: argparse.Namespace, extra: list[str]) -> int:
    """Run pytest (SQLite unless ``--db postgres|mariadb``); extra arguments go to pytest.

    With ``--db``, ``DATABASE_URL`` is used when it names that kind of database
    (its scheme), else the default of :data:`DATABASE_URLS`.
    """
    python = str(ensure_venv(opts, GROUPS["test"] + DB_GROUPS.get(opts.db, [])))
    (ROOT / ".artifacts").mkdir(exist_ok=True)
    env = dict(os.environ)
    if opts.db in DATABASE_URLS:
        default, schemes = DATABASE_URLS[opts.db]
        if env.get("DATABASE_URL", "").partition("://")[0] not in schemes:
            env["DATABASE_URL"] = default
    else:
        env.pop("DATABASE_URL", None)
    cmd = [python, "-m", "pytest"]
    if opts.markers:
        cmd += ["-m", opts.markers]
    return run(cmd + extra, env=env, check=False)


def cmd_lint(opts: argparse.Namespace, extra: list[str]) -> int:
    """ruff check, ruff format --check, mypy, and makemigrations --check; report every failure."""
    python = str(ensure_venv(opts, GROUPS["lint"]))
    (ROOT / ".artifacts").mkdir(exist_ok=True)
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env["DEBOUNCE_EXAMPLE_SQLITE"] = str(ROOT / ".artifacts" / "lint-example.sqlite3")
    steps = [
        ("ruff check", [python, "-m", "ruff", "check", "."]),
        ("ruff format --check", [python, "-m", "ruff", "format", "--check", "."]),
        ("mypy", [python, "-m", "mypy"]),
        (
            "makemigrations --check",
            [
                python,
                "manage.py",
                "makemigrations",
                "--check",
                "--dry-run",
                "--settings",
                "tests.settings",
                "django_debounce",
                "testapp",
            ],
        ),
        (
            "makemigrations --check (example project)",
            [python, "manage.py", "makemigrations", "--check", "--dry-run"],
        ),
    ]
    failed = []
    for label, cmd in steps:
        say(f"lint: {label}")
        if run(cmd, env=env, check=False) != 0:
            failed.append(label)
    if failed:
        say(f"lint failed: {', '.join(failed)}")
        return 1
    say("lint passed")
    return 0


def cmd_bench(opts: argparse.Namespace, extra: list[str]) -> int:
    """Run ``bench/NAME.py`` (``python3 dev.py bench NAME -- --rows 1000``); see bench/README.md."""
    names = sorted(
        path.stem
        for path in (ROOT / "bench").glob("*.py")
        if path.stem not in {"common", "settings", "urls"}
    )
    if not extra or extra[0] not in names:
        sys.exit(f"dev.py bench needs a benchmark name: {', '.join(names)}")
    python = str(ensure_venv(opts, GROUPS["bench"]))
    return run([python, f"bench/{extra[0]}.py", *extra[1:]], check=False)


def cmd_docs(opts: argparse.Namespace, extra: list[str]) -> int:
    """Build the documentation site into ``.artifacts/docs`` (Sphinx; warnings are errors).

    A fresh build every time (``-E``: no cached environment, so every page is read and
    every warning shows), nitpicky (``-n``), ``-W --keep-going`` (every warning is listed,
    then the build fails). Extra arguments go to ``sphinx-build``, e.g. ``-- -b linkcheck``.
    Open ``.artifacts/docs/index.html``.
    """
    python = str(ensure_venv(opts, GROUPS["docs"]))
    out = ROOT / ".artifacts" / "docs"
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    cmd = [python, "-m", "sphinx", "-b", "html", "-E", "-n", "-W", "--keep-going", "-q"]
    code = run([*cmd, *extra, "docs", str(out)], env=env, check=False)
    if code == 0:
        say(f"docs built: {out / 'index.html'}")
    return code


COMMANDS = {
    "demo": cmd_demo,
    "test": cmd_test,
    "lint": cmd_lint,
    "bench": cmd_bench,
    "docs": cmd_docs,
}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` at the first ``--``: what follows goes to the tool (pytest, replay_events)."""
    passthrough: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="dev.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument(
        "--python",
        help="interpreter for the venv, e.g. python3.12 (default: the one running dev.py)",
    )
    parser.add_argument(
        "--django", help='Django requirement, e.g. "Django>=6.1,<6.2" (default: newest allowed)'
    )
    parser.add_argument(
        "--db",
        choices=["sqlite", *DATABASE_URLS],
        default="sqlite",
        help="test database (postgres, mariadb: DATABASE_URL if it names one, else "
        + ", ".join(url for url, _ in DATABASE_URLS.values())
        + ")",
    )
    parser.add_argument("-m", dest="markers", help='pytest marker expression, e.g. "not slow"')
    opts, unknown = parser.parse_known_args(argv)
    return opts, unknown + passthrough


def main(argv: list[str]) -> int:
    opts, extra = parse(argv)
    return COMMANDS[opts.command](opts, extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
