"""Tasks of the outcome-storing tests (names start with ``st.``): results and errors a
database cannot store as they are (tests/processes/test_unstorable_outcomes.py)."""

from __future__ import annotations

import os
from typing import Any

from django_debounce import task

from .models import CallLog


def _log(name: str, job_id: int | None = None) -> None:
    CallLog.objects.create(task=name, pid=os.getpid(), job_id=job_id)


@task(name="st.huge_int", max_retries=2)
def huge_int() -> int:
    """Return an int of 5,001 digits: more than json writes (4,300)."""
    _log("st.huge_int")
    return 10**5000


@task(name="st.surrogate_error", max_retries=0)
def surrogate_error() -> None:
    """Raise an error whose text holds a lone surrogate, as a file name decoded with
    ``os.fsdecode`` does for a byte that is not UTF-8."""
    _log("st.surrogate_error")
    raise ValueError("cannot open " + os.fsdecode(b"report-\xff.csv"))


@task(name="st.nested", max_retries=2)
def nested(levels: int) -> Any:
    """Return a list nested ``levels`` deep around the int 1 (``[[1]]`` for 2)."""
    _log("st.nested")
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@task(name="st.text", max_retries=2)
def text(size: int) -> str:
    """Return a str of ``size`` characters ``x``."""
    _log("st.text")
    return "x" * size


@task(name="st.returns", max_retries=2)
def returns(value: Any) -> Any:
    """Return the argument it was called with."""
    _log("st.returns")
    return value


@task(name="st.fails", max_retries=2)
def fails(message: str) -> None:
    """Raise ``RuntimeError(message)``."""
    _log("st.fails")
    raise RuntimeError(message)


@task(name="st.bad_text", max_retries=2)
def bad_text() -> dict[str, Any]:
    """Return text no database stores: a lone surrogate, NUL in a value and in a key."""
    _log("st.bad_text")
    return {"name": os.fsdecode(b"report-\xff.csv"), "nul": "a\x00b", "key\x00": [1]}
