"""Build the package once and run commands outside the checkout (the built-wheel tests).

Shared by ``tests/processes/test_built_wheel.py`` and ``tests/processes/test_tutorial.py``:
:func:`clean_env` (an environment with nothing of the checkout in it), :func:`run` (a
command that fails the test with its output) and :func:`build_dist` (the sdist and the
wheel, checked by ``twine check --strict``), which ``tests/processes/conftest.py`` calls
once per session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
#: A subprocess that takes longer than this is stuck (pip resolving, a hung worker).
STEP_TIMEOUT = 300


def clean_env() -> dict[str, str]:
    """The environment of a shell with nothing of the checkout or this test run in it."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PATH"] = os.pathsep.join(
        part
        for part in os.environ.get("PATH", "").split(os.pathsep)
        if part and not Path(part).resolve().is_relative_to(REPO)
    )
    return env


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` in ``cwd``; return its stdout, failing the test with its output if it fails."""
    result = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result.stdout


def build_dist(out: Path) -> dict[str, Path]:
    """Build the sdist and the wheel into ``out``; ``twine check`` them; return both paths.

    Fails the calling test when the build fails, when the file names are not this
    version's, or when ``twine check --strict`` does not pass both.
    """
    # The checkout's own interpreter has build and twine (the `release` dependency group);
    # the build itself runs in build's isolated environment, with hatchling from the index.
    env = clean_env()
    run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=out, env=env)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert [w.name for w in wheels] == [f"django_debounce-{VERSION}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"django_debounce-{VERSION}.tar.gz"]
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists], out, env)
    assert checked.count("PASSED") == 2, checked
    return {"wheel": wheels[0], "sdist": sdists[0]}
