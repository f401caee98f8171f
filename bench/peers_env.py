# ruff: noqa: T201  (prints what it installs)
"""The peers' own virtual environment, ``bench/.venv-peers`` (never the project's venv).

    python3 bench/peers_env.py            # create or update it; prints its python
    python3 bench/peers_env.py --force    # recreate it

Holds the peers of issue #12's suite (``bench/peer_run.py`` runs in it):
django-tasks-db (Django's ``django.tasks`` database backend and its
``db_worker``; Django 6.1 ships ``django.tasks``, so no ``django-tasks``
backport), procrastinate (plain ``App`` + ``PsycopgConnector``) and Celery on
Redis, with psycopg 3 and dj-database-url. Needs Python 3.12+ (Django 6.1);
``--python`` picks the interpreter (default: found as ``dev.py --python
python3.12`` would). A stamp file records the requirements: an unchanged list
is not reinstalled (a fresh install takes ~20 s on the project's machines).
The folder is git-ignored (``.venv*/``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venv-peers"
STAMP = VENV / "peers-requirements.json"
#: What the peers need; the lower bounds are the versions whose API bench/peer_run.py uses.
REQUIREMENTS = [
    "Django>=6.1,<6.2",
    "django-tasks-db>=0.13",
    "procrastinate>=3.10",
    "celery[redis]>=5.4",
    "psycopg[binary]>=3.1",
    "dj-database-url>=2.2",
]


def python_of_venv() -> Path:
    return VENV / "bin" / "python"


def ensure(python: str | None = None, *, force: bool = False, quiet: bool = True) -> Path:
    """Create or update ``bench/.venv-peers``; return its interpreter.

    Args:
        python: the interpreter to build it from (a name or a path); ``None``: Python 3.12
            found the way ``dev.py --python python3.12`` finds it.
        force: delete and recreate the venv.
        quiet: pass ``-q`` to pip.

    Raises:
        SystemExit: no suitable interpreter, or pip failed (its exit code).
    """
    sys.path.insert(0, str(ROOT))
    import dev  # the repository's dev.py: its interpreter finder (pyenv shims included)

    if force and VENV.exists():
        shutil.rmtree(VENV)
    key = {"requirements": REQUIREMENTS}
    if STAMP.exists() and json.loads(STAMP.read_text()) == key and python_of_venv().exists():
        return python_of_venv()
    if not python_of_venv().exists():
        executable, version = dev.find_python(python or "python3.12")
        print(f"peers_env: creating {VENV.relative_to(ROOT)} with Python {version}", flush=True)
        subprocess.run([executable, "-m", "venv", str(VENV)], check=True)
    print(f"peers_env: installing {', '.join(REQUIREMENTS)}", flush=True)
    cmd = [str(python_of_venv()), "-m", "pip", "install", "--disable-pip-version-check"]
    if quiet:
        cmd.append("-q")
    code = subprocess.call([*cmd, *REQUIREMENTS])
    if code != 0:
        sys.exit(code)
    STAMP.write_text(json.dumps(key))
    return python_of_venv()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", help="interpreter to build the venv from (3.12+)")
    parser.add_argument("--force", action="store_true", help="recreate the venv")
    args = parser.parse_args()
    print(ensure(args.python, force=args.force, quiet=False))


if __name__ == "__main__":
    main()
