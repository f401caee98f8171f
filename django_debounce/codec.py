"""The payload codec (contract §5, §11).

Arguments are stored as JSON. Plain JSON values (``str``, ``int``, ``float``,
``bool``, ``None``, ``list``, ``dict`` with ``str`` keys) are stored as
themselves. Other supported types are stored as a one-key tagged object
``{"__debounce__": [tag, value]}``:

=============  ====================================================
type           stored form
=============  ====================================================
``UUID``       ``["uuid", "12345678-1234-5678-1234-567812345678"]``
``Decimal``    ``["decimal", "0.10"]`` (exact, ``str`` form)
``datetime``   ``["datetime", "2024-02-29T10:00:00+01:00"]`` (aware only)
``date``       ``["date", "2024-02-29"]``
``time``       ``["time", "23:59:59.999999"]`` (offset kept if given)
``timedelta``  ``["timedelta", [days, seconds, microseconds]]``
``float``      ``["float", "1e+16"]``, only for integral floats in
               exponent form and ``-0.0``, which PostgreSQL's jsonb
               would return as an int or ``0.0``
=============  ====================================================

Strings may not contain NUL (``\\x00``) or lone surrogates, and nesting is
limited to :data:`MAX_DEPTH` levels: PostgreSQL cannot store the former, and
the worker could not decode the latter.

Tuples are stored as lists (and come back as lists). An aware ``datetime``
comes back as the same instant with the same UTC offset, as a fixed-offset
``timezone`` (the zone object, e.g. ``ZoneInfo("Europe/Berlin")``, is not
kept). A dict that itself has the key ``"__debounce__"`` is escaped.
"""

from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from .exceptions import PayloadError

TAG = "__debounce__"

#: Deepest nesting of lists and dicts a payload may have (decoding recurses).
MAX_DEPTH = 100

_HINT = (
    " Pass JSON values, UUID, Decimal, aware datetime, date, time, timedelta or "
    "tuples; for a model instance pass its primary key and load it in the task."
)


def encode(value: Any, *, path: str = "argument") -> Any:
    """Return the JSON form of ``value``.

    Args:
        value: the argument to store.
        path: where the value sits in the call, for the error message
            (e.g. ``"kwargs['meta']['ids'][0]"``).

    Raises:
        PayloadError: ``value`` (or something inside it) is of an unsupported
            type, a naive ``datetime``, a non-finite float, or a dict with a
            non-``str`` key.
    """
    return _encode(value, path, 0)


def _check_text(text: str, path: str) -> str:
    if "\x00" in text:
        raise PayloadError(
            f"{path} contains a NUL character (\\x00), which databases cannot store."
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(f"{path} is not valid Unicode text ({exc.reason}).") from exc
    return text


def _encode(value: Any, path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PayloadError(f"{path} is nested more than {MAX_DEPTH} levels deep.")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return _check_text(value, path)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path}={value!r}: JSON cannot store NaN or infinity.")
        if (value.is_integer() and "e" in repr(value)) or (
            value == 0 and math.copysign(1, value) < 0
        ):
            # PostgreSQL's jsonb would hand 1e16 back as an int and -0.0 as 0.0.
            return {TAG: ["float", repr(value)]}
        return value
    if isinstance(value, list | tuple):
        return [_encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{path} has the key {key!r} of type {type(key).__name__}; "
                    "payload dicts need str keys."
                )
            out[_check_text(key, f"{path} key")] = _encode(item, f"{path}[{key!r}]", depth + 1)
        if TAG in out:
            return {TAG: ["dict", out]}
        return out
    if isinstance(value, UUID):
        return {TAG: ["uuid", str(value)]}
    if isinstance(value, Decimal):
        return {TAG: ["decimal", str(value)]}
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise PayloadError(
                f"{path}={value!r} is a naive datetime, an ambiguous instant. "
                "Pass an aware datetime (django.utils.timezone.now(), or "
                "timezone.make_aware(value))."
            )
        return {TAG: ["datetime", value.isoformat()]}
    if isinstance(value, date):
        return {TAG: ["date", value.isoformat()]}
    if isinstance(value, time):
        return {TAG: ["time", value.isoformat()]}
    if isinstance(value, timedelta):
        return {TAG: ["timedelta", [value.days, value.seconds, value.microseconds]]}
    raise PayloadError(
        f"{path} has type {type(value).__name__}, which the codec cannot store." + _HINT
    )


def decode(value: Any) -> Any:
    """Return the Python value stored as ``value`` by :func:`encode`."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1 and TAG in value:
            tag, data = value[TAG]
            if tag == "dict":
                return {key: decode(item) for key, item in data.items()}
            return _DECODERS[tag](data)
        return {key: decode(item) for key, item in value.items()}
    return value


def _timedelta(data: list[int]) -> timedelta:
    days, seconds, microseconds = data
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)


_DECODERS: dict[str, Any] = {
    "uuid": UUID,
    "decimal": Decimal,
    "datetime": datetime.fromisoformat,
    "date": date.fromisoformat,
    "time": time.fromisoformat,
    "timedelta": _timedelta,
    "float": float,
}


def encode_call(
    args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Return the stored ``(args, kwargs)`` of a call, raising :class:`PayloadError` first."""
    enc_args = [encode(value, path=f"args[{i}]") for i, value in enumerate(args)]
    enc_kwargs = {}
    for key, value in kwargs.items():
        enc_kwargs[key] = encode(value, path=f"kwargs[{key!r}]")
    return enc_args, enc_kwargs


def decode_call(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Return the ``(args, kwargs)`` a task receives for stored ``args``/``kwargs``."""
    return [decode(value) for value in args], {key: decode(value) for key, value in kwargs.items()}
