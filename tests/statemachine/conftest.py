"""Hypothesis keeps its files (a constants cache; no example database) under ``.artifacts/``."""

from __future__ import annotations

from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(Path(__file__).resolve().parents[2] / ".artifacts" / "hypothesis")
