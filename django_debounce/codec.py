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

Tuples are stored as lists (and come back as lists). An aware ``datetime``
comes back as the same instant with the same UTC offset, as a fixed-offset
``timezone`` (the zone object, e.g. ``ZoneInfo("Europe/Berlin")``, is not
kept). A dict that itself has the key ``"__debounce__"`` is escaped.

Limits, the same on every database (decision 29, "Payload limits", in docs/decisions.md),
checked while encoding so that nothing reaches the database that one of them
would refuse:

* strings and dict keys may not contain NUL (``\\x00``), which PostgreSQL
  cannot store, or lone surrogates, which are not Unicode text;
* a stored JSON column nests at most :data:`MAX_DEPTH` (31) levels of arrays
  and objects, the most MariaDB's ``JSON_VALID`` accepts: an argument (inside
  the ``args`` list or the ``kwargs`` dict) may nest 30 levels of lists and
  dicts, counted in its stored form (a tagged value adds two levels);
* an ``int`` has at most :data:`MAX_INT_DIGITS` (4,300) digits, the most
  Python's ``json`` writes and reads by default;
* the JSON text of a call's ``args`` and ``kwargs`` together is at most
  ``DEBOUNCE_MAX_PAYLOAD_BYTES`` (1 MiB by default), measured as
  ``len(json.dumps(args)) + len(json.dumps(kwargs))``: the text Django sends.
  The walk adds up a cheap upper bound of that length; only a payload whose
  bound passes the limit is serialised once more to measure it exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from .conf import MIN_PAYLOAD_BYTES, settings
from .exceptions import PayloadError

TAG = "__debounce__"

#: Deepest nesting of JSON arrays and objects in one stored column (``Job.args``,
#: ``Job.kwargs``, ``Job.metadata``, ``Job.result``): MariaDB's ``JSON_VALID`` refuses a
#: 32nd level (PostgreSQL and SQLite accept far more), so one limit holds everywhere.
MAX_DEPTH = 31

#: Most digits of an ``int`` (``sys.int_info.default_max_str_digits``): ``json`` cannot
#: write a longer one, nor read it back, under Python's default limit.
MAX_INT_DIGITS = 4300

_INT_LIMIT = 10**MAX_INT_DIGITS
#: Ints strictly inside ±2**63 need no check and take at most 20 characters of JSON.
_SMALL_INT = 2**63
#: Upper bound of the JSON characters of one container item that is not a str (a 64-bit
#: int, a float's repr, null/true/false: at most 24) plus its ", " separator. A str
#: item adds its own bound on top; tagged values and big ints add theirs.
_ITEM = 26
#: Upper bound of the characters around a tagged value: ``{"__debounce__": ["decimal", ]}``.
_TAG_FRAME = 40

_HINT = (
    " Pass JSON values, UUID, Decimal, aware datetime, date, time, timedelta or "
    "tuples; for a model instance pass its primary key and load it in the task."
)


def encode(value: Any, *, path: str = "argument", depth: int = 0, sized: bool = False) -> Any:
    """Return the JSON form of ``value``.

    Args:
        value: the argument (or result) to store.
        path: where the value sits in the call, for the error message
            (e.g. ``"kwargs['meta']['ids'][0]"``).
        depth: how many JSON arrays/objects the value is stored inside: 0 for
            a value that is a column's whole content (a task's result), 1 for
            an argument inside ``Job.args``. :data:`MAX_DEPTH` counts from there.
        sized: also refuse a value whose JSON text (``json.dumps``) is longer
            than ``DEBOUNCE_MAX_PAYLOAD_BYTES``.

    Raises:
        PayloadError: ``value`` (or something inside it) is of an unsupported
            type, a naive ``datetime``, a non-finite float, a dict with a
            non-``str`` key, text with NUL or a lone surrogate, an ``int``
            of more than 4,300 digits, or nested deeper than
            :data:`MAX_DEPTH`; with ``sized``, its JSON text is too long.
        ConfigurationError: with ``sized``, ``DEBOUNCE_MAX_PAYLOAD_BYTES`` is
            invalid (check E014).
    """
    bound = [_ITEM]
    out = _encode(value, path, depth, bound)
    if sized:
        _check_size(bound[0], (out,), path)
    return out


def is_storable_text(text: str) -> bool:
    """Return True when every supported database can store ``text`` as it is.

    False for text with a NUL character (PostgreSQL refuses it) or a lone
    surrogate (not Unicode text: no driver can encode it).
    """
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str, path: str, bound: list[int], key: bool = False) -> str:
    """Return ``text`` if a database can store it, adding its JSON length bound to ``bound``.

    ``path`` names the value (or, with ``key``, the dict the key is in) for the error.
    """
    if text.isascii():  # the common case: no surrogate possible, no encode() needed
        if "\x00" in text:
            raise _nul(f"{path} key {text!r}" if key else path)
        bound[0] += 6 * len(text) + 2  # worst case: every character a \u00XX escape
        return text
    if "\x00" in text:
        raise _nul(f"{path} key {text!r}" if key else path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"{path} key {text!r}" if key else path
        raise PayloadError(
            f"{where} holds a lone surrogate ({text[exc.start]!r} at position {exc.start}), "
            "which is not Unicode text and no database can store. Text decoded with "
            "os.fsdecode() or errors='surrogateescape' holds them: decode the bytes with "
            "errors='replace' instead."
        ) from exc
    bound[0] += 12 * len(text) + 2  # an astral character is written as two \uXXXX escapes
    return text


def _nul(path: str) -> PayloadError:
    return PayloadError(
        f"{path} contains a NUL character (\\x00), which PostgreSQL cannot store (and so, "
        "for the same behaviour everywhere, no database here does). Remove it, or pass "
        "binary data as base64 text."
    )


def _too_deep(path: str) -> PayloadError:
    return PayloadError(
        f"{path} is nested too deeply: stored, it would need more than {MAX_DEPTH} levels of "
        f"JSON arrays/objects, the most every supported database accepts (MariaDB's limit), "
        f"so an argument may nest at most {MAX_DEPTH - 1} levels of lists and dicts. Flatten "
        "it, or store the data elsewhere and pass its id."
    )


def _big_int(value: int, path: str, bound: list[int]) -> int:
    if -_INT_LIMIT < value < _INT_LIMIT:
        bound[0] += value.bit_length() * 31 // 100 + 2  # digits <= bits * log10(2) + 1, a sign
        return value
    raise PayloadError(
        f"{path} is an int of more than {MAX_INT_DIGITS} digits, which JSON cannot carry "
        f"(Python's int/str conversion stops at {MAX_INT_DIGITS} digits). Pass it in "
        "another form, e.g. hex(value) (no digit limit) and int(text, 16) in the task."
    )


def _tagged(tag: str, data: Any, path: str, depth: int, bound: list[int], size: int) -> Any:
    """Return ``{TAG: [tag, data]}``: an object and an array around ``data`` (§5)."""
    if depth + 2 > MAX_DEPTH:
        raise _too_deep(path)
    bound[0] += _TAG_FRAME + size
    return {TAG: [tag, data]}


def _encode(value: Any, path: str, depth: int, bound: list[int]) -> Any:
    """Encode ``value`` stored inside ``depth`` arrays/objects; add its JSON length bound."""
    if value is None:
        return value
    if isinstance(value, int):  # bool included
        if -_SMALL_INT < value < _SMALL_INT:
            return value
        return _big_int(value, path, bound)
    if isinstance(value, str):
        return _check_text(value, path, bound)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path}={value!r}: JSON cannot store NaN or infinity.")
        if (value.is_integer() and "e" in repr(value)) or (
            value == 0 and math.copysign(1, value) < 0
        ):
            # PostgreSQL's jsonb would hand 1e16 back as an int and -0.0 as 0.0.
            return _tagged("float", repr(value), path, depth, bound, 26)
        return value
    if isinstance(value, list | tuple):
        depth += 1
        if depth > MAX_DEPTH:
            raise _too_deep(path)
        bound[0] += 2 + _ITEM * len(value)
        return [_encode(item, f"{path}[{i}]", depth, bound) for i, item in enumerate(value)]
    if isinstance(value, dict):
        escaped = TAG in value  # stored as {TAG: ["dict", {...}]}: two levels more
        depth += 3 if escaped else 1
        if depth > MAX_DEPTH:
            raise _too_deep(path)
        bound[0] += 2 + (_ITEM + 2) * len(value) + (_TAG_FRAME if escaped else 0)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{path} has the key {key!r} of type {type(key).__name__}; "
                    "payload dicts need str keys."
                )
            out[_check_text(key, path, bound, key=True)] = _encode(
                item, f"{path}[{key!r}]", depth, bound
            )
        if escaped:
            return {TAG: ["dict", out]}
        return out
    if isinstance(value, UUID):
        return _tagged("uuid", str(value), path, depth, bound, 38)
    if isinstance(value, Decimal):
        text = str(value)
        return _tagged("decimal", text, path, depth, bound, len(text) + 2)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise PayloadError(
                f"{path}={value!r} is a naive datetime, an ambiguous instant. "
                "Pass an aware datetime (django.utils.timezone.now(), or "
                "timezone.make_aware(value))."
            )
        return _tagged("datetime", value.isoformat(), path, depth, bound, 40)
    if isinstance(value, date):
        return _tagged("date", value.isoformat(), path, depth, bound, 14)
    if isinstance(value, time):
        return _tagged("time", value.isoformat(), path, depth, bound, 24)
    if isinstance(value, timedelta):
        if depth + 3 > MAX_DEPTH:
            raise _too_deep(path)
        return _tagged(
            "timedelta", [value.days, value.seconds, value.microseconds], path, depth, bound, 40
        )
    raise PayloadError(
        f"{path} has type {type(value).__name__}, which the codec cannot store." + _HINT
    )


def _check_size(bound: int, parts: tuple[Any, ...], what: str) -> None:
    """Raise :class:`PayloadError` if the JSON text of ``parts`` is over the limit.

    ``bound`` is an upper bound of that length added up by the walk: only when
    it passes the limit is the text measured (``json.dumps``, as Django writes it).
    """
    if bound <= MIN_PAYLOAD_BYTES:  # no valid limit is lower: skip reading the setting
        return
    limit = settings.max_payload_bytes
    if bound <= limit:
        return
    size = sum(len(json.dumps(part)) for part in parts)
    if size > limit:
        raise PayloadError(
            f"{what} is {size:,} bytes of JSON; the limit is {limit:,} "
            "(DEBOUNCE_MAX_PAYLOAD_BYTES). A job queue is the wrong place for bulk data: store "
            "it elsewhere (a table, a file) and pass its id, or raise the setting within what "
            "your database accepts (MariaDB: max_allowed_packet)."
        )


def check_json(value: Any, *, path: str, depth: int = 0) -> None:
    """Check that ``value`` is plain JSON every supported database stores unchanged.

    For option values stored as they are (``metadata``), not through the codec:
    ``None``, ``bool``, ``int``, finite ``float``, ``str``, lists and dicts
    with ``str`` keys, under the same text, ``int`` and depth limits as
    :func:`encode`. ``depth`` as for :func:`encode`.

    Raises:
        PayloadError: naming the first value that breaks a rule.
    """
    bound = [0]  # check_json's callers measure the size themselves
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -_SMALL_INT < value < _SMALL_INT:
            _big_int(value, path, bound)
    elif isinstance(value, str):
        _check_text(value, path, bound)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path}={value!r}: JSON cannot store NaN or infinity.")
    elif isinstance(value, list):
        if depth + 1 > MAX_DEPTH:
            raise _too_deep(path)
        for i, item in enumerate(value):
            check_json(item, path=f"{path}[{i}]", depth=depth + 1)
    elif isinstance(value, dict):
        if depth + 1 > MAX_DEPTH:
            raise _too_deep(path)
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path} has the key {key!r}; JSON objects need str keys.")
            _check_text(key, path, bound, key=True)
            check_json(item, path=f"{path}[{key!r}]", depth=depth + 1)
    else:
        raise PayloadError(
            f"{path} has type {type(value).__name__}; only plain JSON values (str, int, "
            "float, bool, None, list, dict with str keys) are stored here."
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


def encode_call(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Return the stored ``(args, kwargs)`` of a call, raising :class:`PayloadError` first.

    Every limit of the module docstring is checked in this one walk, the size
    limit (``DEBOUNCE_MAX_PAYLOAD_BYTES``) on ``args`` and ``kwargs`` together.

    Raises:
        PayloadError: as :func:`encode`; also a keyword argument name that is
            not a ``str`` or holds NUL or a lone surrogate.
        ConfigurationError: ``DEBOUNCE_MAX_PAYLOAD_BYTES`` is invalid (check E014).
    """
    bound = [4 + _ITEM * len(args) + (_ITEM + 2) * len(kwargs)]
    enc_args = [_encode(value, f"args[{i}]", 1, bound) for i, value in enumerate(args)]
    enc_kwargs = {}
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise PayloadError(
                f"kwargs has the key {key!r} of type {type(key).__name__}; keyword argument "
                "names must be str."
            )
        path = f"kwargs[{key!r}]"
        enc_kwargs[_check_text(key, "kwargs", bound, key=True)] = _encode(value, path, 1, bound)
    _check_size(bound[0], (enc_args, enc_kwargs), "the payload (args and kwargs)")
    return enc_args, enc_kwargs


def decode_call(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Return the ``(args, kwargs)`` a task receives for stored ``args``/``kwargs``."""
    return [decode(value) for value in args], {key: decode(value) for key, value in kwargs.items()}
