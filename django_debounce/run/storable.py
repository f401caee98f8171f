"""A run's result and error in a form every supported database stores (contract §7, §11).

A task may return anything and raise anything; what the worker writes on the
job must never fail because of it, or the run would be repeated. These
functions never raise: :func:`storable_result` for a return value,
:func:`format_error` and :func:`format_traceback` for an exception, and
:func:`storable_text` for any text. "Never" includes a value whose own code
raises while it is read: an ``__iter__``, ``__getattribute__``, ``__repr__``
or ``__str__`` that raises, ``SystemExit`` and other ``BaseException`` subclasses
included (decision 149 in docs/decisions.md); only a stop of the process
itself (:func:`~django_debounce.run.interrupts.is_host_stop`) goes through.
"""

from __future__ import annotations

import re
import reprlib
import traceback as traceback_module
from typing import Any

from .. import codec
from .interrupts import is_host_stop

#: Most characters of an error message or a traceback stored on a job and its dead
#: letter; the rest is cut (a 20 MB exception message must not make the write fail).
MAX_ERROR_CHARS = 65_536
#: Most characters of the ``repr`` recorded for a result the codec cannot store.
MAX_REPR_CHARS = 10_000

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str, limit: int | None = None) -> str:
    """Return ``text`` in a form every supported database stores.

    NUL characters (PostgreSQL refuses them) and lone surrogates (not Unicode
    text: no driver can encode them, e.g. from ``os.fsdecode(b"\\xff")``)
    become U+FFFD; text longer than ``limit`` characters is cut to ``limit``
    characters, its end a note of how much was cut.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    if limit is not None and len(text) > limit:
        # The note counts against the limit: cut for the longest note this text can need.
        keep = limit - len(f"… [cut: {len(text):,} more characters]")
        text = f"{text[:keep]}… [cut: {len(text) - keep:,} more characters]"
    return text


def ascii_text(text: str) -> str:
    """Return ``text`` with every non-ASCII character escaped (``\\xe9``): storable anywhere."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


class _ShortRepr(reprlib.Repr):
    """``repr`` that stays short for big or deep values and never raises on a huge int."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 10
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = 100
        self.maxset = self.maxfrozenset = self.maxdeque = 100
        self.maxstring = self.maxother = MAX_REPR_CHARS
        self.maxlong = 100

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:  # more digits than int -> str converts
            return f"<int of {x.bit_length():,} bits, too long to write in decimal>"


_short_repr = _ShortRepr()


def short_repr(value: object) -> str:
    """Return a storable ``repr`` of ``value`` of at most :data:`MAX_REPR_CHARS` characters.

    Never raises: a ``repr`` that raises (whatever it raises, but a stop of the
    process, :func:`~django_debounce.run.interrupts.is_host_stop`) gives
    ``"<unrepresentable TypeName>"``.
    """
    try:
        return storable_text(_short_repr.repr(value), MAX_REPR_CHARS)
    except BaseException as exc:  # a repr that raises must not lose the run
        if is_host_stop(exc):
            raise
    return storable_text(f"<unrepresentable {type(value).__qualname__}>", MAX_REPR_CHARS)


def storable_result(value: object) -> Any:
    """Return the JSON a task's return value is recorded as (§7); never raises.

    The codec's form when it can store the value under the payload limits
    (decision 29 in docs/decisions.md), after turning NUL characters and
    lone surrogates in its strings into U+FFFD if it has any. Otherwise a
    shortened ``repr`` string (at most :data:`MAX_REPR_CHARS` characters): a
    set or a model instance, an ``int`` of more than 4,300 digits, a value
    nested more than 31 levels deep or whose JSON is longer than
    ``DEBOUNCE_MAX_PAYLOAD_BYTES``, a dict with a key that is not a ``str``
    (a tuple, an int), and a value whose own code raises while it is read (an
    ``__iter__`` or ``__getattribute__`` that raises, whatever it raises;
    decision 149). A result that cannot be written must never turn a
    successful run into a rerun.

    Raises:
        SystemExit: only a stop of the process that a signal handler raised
            meanwhile (:func:`~django_debounce.run.interrupts.is_host_stop`).
    """
    for scrub in (False, True):
        try:
            return codec.encode(_scrub(value) if scrub else value, path="result", sized=True)
        except BaseException as exc:  # the value's own code may raise anything
            if is_host_stop(exc):
                raise
    return short_repr(value)


def _scrub(value: object) -> object:
    """Return ``value`` with NUL characters and lone surrogates in its strings made U+FFFD.

    Only ``str`` keys are scrubbed; any other key is kept as it is (a tuple key
    turned into a list could not be a key, and the codec refuses it anyway).
    """
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list | tuple):
        return [_scrub(item) for item in value]
    if isinstance(value, dict):
        return {
            (storable_text(key) if isinstance(key, str) else key): _scrub(item)
            for key, item in value.items()
        }
    return value


def format_error(exc: BaseException) -> str:
    """Return ``"dotted.ExceptionClass: message"`` (builtins without module, §11).

    Made storable (:func:`storable_text`) and cut to :data:`MAX_ERROR_CHARS`.
    """
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(exc)
    except BaseException as failed:  # an exception's __str__ may raise anything
        if is_host_stop(failed):
            raise
        message = "<the exception's message could not be rendered>"
    return storable_text(f"{name}: {message}", MAX_ERROR_CHARS)


def format_traceback(exc: BaseException) -> str:
    """Return the formatted traceback of ``exc``, storable and cut to :data:`MAX_ERROR_CHARS`."""
    try:
        text = "".join(traceback_module.format_exception(exc))
    except BaseException as failed:
        if is_host_stop(failed):
            raise
        text = "<the traceback could not be formatted>"
    return storable_text(text, MAX_ERROR_CHARS)


__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_REPR_CHARS",
    "ascii_text",
    "format_error",
    "format_traceback",
    "short_repr",
    "storable_result",
    "storable_text",
]
