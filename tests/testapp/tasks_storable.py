"""Tasks of the outcome-storing tests (names start with ``st.``): results and errors a
database cannot store as they are (tests/processes/run/test_unstorable_outcomes.py)."""

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


class IterRaises(list):  # type: ignore[type-arg]
    """A list whose ``__iter__`` raises ``error`` (the codec walks a list through it)."""

    error: BaseException = RuntimeError("no iterating me")

    def __iter__(self) -> Any:
        raise self.error


class IterExits(IterRaises):
    """A list whose ``__iter__`` calls ``sys.exit(3)``."""

    error = SystemExit(3)


class NoAttributes:
    """An object every attribute read of which raises (``isinstance`` reads ``__class__``)."""

    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError(f"no attribute {name}")

    def __repr__(self) -> str:  # special methods are looked up on the type
        return "<NoAttributes>"


class ReprRaises:
    """An object whose ``repr`` raises ``RuntimeError``."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class ReprInterrupts:
    """An object whose ``repr`` raises ``KeyboardInterrupt``."""

    def __repr__(self) -> str:
        raise KeyboardInterrupt


#: What ``st.odd`` returns, by kind: results the codec cannot store as they are.
ODD_RESULTS: dict[str, Any] = {
    "tuple_key": lambda: {(1, 2): "pair", "n": 1},
    "int_key": lambda: {1: "one"},
    "nested_tuple_key": lambda: [{"ok": {("a",): None}}],
    "iter_raises": lambda: IterRaises([1, 2]),
    "iter_exits": lambda: {"rows": IterExits([1])},
    "no_attributes": lambda: NoAttributes(),
    "repr_raises": lambda: {(0,): ReprRaises()},
    "repr_interrupts": lambda: ReprInterrupts(),
}


@task(name="st.odd", max_retries=2)
def odd(kind: str) -> Any:
    """Return the value ``ODD_RESULTS[kind]`` makes."""
    _log("st.odd")
    return ODD_RESULTS[kind]()
