"""Fixtures of the process tests: the package built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.built_wheel import build_dist


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel (``{"wheel": path, "sdist": path}``), built and checked once
    per session for every test that installs the package (the built-wheel test, the tutorial's)."""
    return build_dist(tmp_path_factory.mktemp("dist"))
