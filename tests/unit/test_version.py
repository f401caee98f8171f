"""The version is written once, in pyproject.toml, and read back as ``django_debounce.__version__``."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import django_debounce

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pyproject_version() -> str:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"]


def test_the_package_version_is_pyprojects():
    # dev.py installs the checkout (editable) and reinstalls when pyproject.toml changes,
    # so the installed metadata is this pyproject's.
    assert django_debounce.__version__ == version("django-debounce") == pyproject_version()


def test_the_version_is_a_release_number_not_the_fallback():
    assert re.fullmatch(r"\d+\.\d+\.\d+", django_debounce.__version__)


def test_no_other_file_writes_the_version_down():
    # Single source: the package reads its metadata; nothing in it repeats the number.
    number = pyproject_version()
    package = PYPROJECT.parent / "django_debounce"
    holders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(f"{q}{number}{q}" in path.read_text(encoding="utf-8") for q in "'\"")
    ]
    assert holders == []


def test_the_docs_name_the_wheel_of_this_version():
    # The install instructions name the built wheel's file; a version bump must update them.
    root = PYPROJECT.parent
    pages = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    named = {
        (str(page.relative_to(root)), found)
        for page in pages
        for found in re.findall(
            r"django_debounce-([0-9][^-\s]*)-py3-none-any\.whl", page.read_text(encoding="utf-8")
        )
    }
    assert len(named) >= 5
    assert {(page, found) for page, found in named if found != pyproject_version()} == set()
