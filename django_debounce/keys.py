"""Resolve debounce and unique keys from a call's arguments (contract §3).

Pure functions: no database, no settings. A key template is a
:meth:`str.format` template whose fields bind through the task function's
signature, so ``{0}`` and ``{user_id}`` name the same argument however the
caller passed it, and a parameter left at its default resolves to the default.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import re
import string
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, time
from decimal import Decimal
from typing import Any

from .codec import encode
from .exceptions import ConfigurationError, KeyResolutionError, PayloadError

#: Longest resolved key text the package stores (§3).
MAX_KEY_LENGTH = 4096

_SCALARS = (str, int, float, bool, Decimal, uuid.UUID, date, time, enum.Enum)

#: The numbers of a format spec: its width and precision (and a digit used as fill, which
#: is one character). ``\d`` is Unicode on purpose: ``format()`` reads ``'>١٠'`` as width 10.
_SPEC_NUMBER = re.compile(r"\d+")


def spec_too_wide(spec: str) -> str | None:
    """Return the width or precision in format ``spec`` beyond :data:`MAX_KEY_LENGTH`, else ``None``.

    ``format(value, ">99999999999")`` allocates that many characters before any
    key limit can refuse the result (``MemoryError``, or 300 MB for
    ``">300000000"``), so a spec is judged before it is used (decision 165).
    The number is returned as ASCII text for the message. A spec that only
    strftime reads (a date's ``%Y``) holds no such number unless written in.
    """
    for run in _SPEC_NUMBER.findall(spec):
        digits = run.lstrip("0") or "0"
        if len(digits) > len(str(MAX_KEY_LENGTH)) or int(digits) > MAX_KEY_LENGTH:
            return (
                str(int(digits)) if len(digits) <= 40 else f"{digits[:20]}… ({len(digits)} digits)"
            )
    return None


def _literal_specs(template: str) -> Iterator[tuple[str, str]]:
    """Yield ``(field, literal part of its format spec)`` for every field of ``template``.

    The template is read by :meth:`string.Formatter.parse`, and a spec with
    nested fields (``{0:>{1}}``) by the same parse, one level deep as
    :meth:`str.format` allows; a nested field's value is judged at enqueue.
    """
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None or not spec:
            continue
        for literal, nested, nested_spec, _ in string.Formatter().parse(spec):
            yield "{" + field + "}", literal
            if nested is not None and nested_spec:
                yield "{" + nested + "}", nested_spec


def check_template(template: str, *, where: str, option: str) -> None:
    """Refuse a key template whose written width or precision no key can hold (decision 165).

    Run when a task is declared and for a call's own template, before any
    formatting. A malformed template is left to :func:`resolve_template`,
    which reports it at enqueue.

    Args:
        template: the ``debounce_key``/``unique_key`` template.
        where: the message prefix, ``"task 'name'"`` or ``"enqueue of 'name'"``.
        option: ``"debounce_key"`` or ``"unique_key"``.

    Raises:
        ConfigurationError: naming ``where``, ``option``, the field and the number.
    """
    try:
        specs = list(_literal_specs(template))
    except ValueError:
        return
    for field, spec in specs:
        number = spec_too_wide(spec)
        if number is not None:
            raise ConfigurationError(
                f"{where}: {option} template {template!r} gives {field} a width or precision "
                f"of {number}; keys are at most {MAX_KEY_LENGTH} characters."
            )


@dataclass(frozen=True)
class BoundCall:
    """A call's arguments as a key template sees them.

    ``positional`` lists the values of the function's parameters in signature
    order (``{0}``, ``{1}``, …), extra ``*args`` appended; ``named`` maps every
    parameter name (and any ``**kwargs`` key) to its value (``{name}``).
    """

    positional: Sequence[Any]
    named: Mapping[str, Any]


def bind_call(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> BoundCall:
    """Bind ``args``/``kwargs`` like the task function would.

    With ``signature=None`` (an enqueue by name from a process that never
    imported the task) ``{N}`` is ``args[N]`` and ``{name}`` is ``kwargs[name]``.

    Raises:
        KeyResolutionError: the arguments do not fit the signature (the
            function itself would raise ``TypeError`` for this call).
    """
    if signature is None:
        return BoundCall(positional=list(args), named=dict(kwargs))
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise KeyResolutionError(f"the arguments do not fit the task's signature: {exc}") from exc
    bound.apply_defaults()
    positional: list[Any] = []
    named: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        value = bound.arguments.get(name)
        if param.kind is param.VAR_POSITIONAL:
            positional.extend(value or ())
        elif param.kind is param.VAR_KEYWORD:
            named.update(value or {})
        else:
            if param.kind is not param.KEYWORD_ONLY:
                positional.append(value)
            named[name] = value
    return BoundCall(positional=positional, named=named)


class _KeyFormatter(string.Formatter):
    def __init__(self, call: BoundCall, template: str) -> None:
        self.call = call
        self.template = template

    def get_value(self, key: int | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        if isinstance(key, int):
            if key >= len(self.call.positional):
                raise KeyResolutionError(
                    f"key template {self.template!r} uses {{{key}}}, but the call has only "
                    f"{len(self.call.positional)} positional argument(s)."
                )
            return self.call.positional[key]
        if key not in self.call.named:
            known = ", ".join(sorted(self.call.named)) or "none"
            raise KeyResolutionError(
                f"key template {self.template!r} uses {{{key}}}, which is not an argument of "
                f"this call (arguments: {known})."
            )
        return self.call.named[key]

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        for part in _field_parts(field_name):
            if part.startswith("_") or "._" in part:
                raise KeyResolutionError(
                    f"key template {self.template!r}: private attribute in {{{field_name}}}."
                )
        try:
            return super().get_field(field_name, args, kwargs)
        except KeyResolutionError:
            raise
        except (LookupError, AttributeError, TypeError) as exc:
            raise KeyResolutionError(
                f"key template {self.template!r}: {{{field_name}}} does not resolve: {exc!r}."
            ) from exc

    def format_field(self, value: Any, format_spec: str) -> str:
        # ``format_spec`` has its nested fields filled in: an argument may have chosen the
        # width (``{0:{1}}``), so it is judged here, before ``format()`` allocates it.
        number = spec_too_wide(format_spec)
        if number is not None:
            raise KeyResolutionError(
                f"key template {self.template!r} gives a value a width or precision of "
                f"{number} (format spec {format_spec[:40]!r}); keys are at most "
                f"{MAX_KEY_LENGTH} characters."
            )
        return render_scalar(value, template=self.template, format_spec=format_spec)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            raise KeyResolutionError(
                f"key template {self.template!r}: conversions like !r are not allowed."
            )
        return value


def _field_parts(field_name: str) -> list[str]:
    first, rest = string._string.formatter_field_name_split(field_name)  # type: ignore[attr-defined]
    parts = [str(first)]
    for is_attr, item in rest:
        if is_attr:
            parts.append(str(item))
    return parts


def render_scalar(value: Any, *, template: str = "", format_spec: str = "") -> str:
    """Return the key text of one scalar (§3): ``str(value)``, an ``Enum`` by its value.

    Raises:
        KeyResolutionError: ``value`` is ``None`` or not a scalar (a dict, list,
            model instance or other object).
    """
    if value is None or not isinstance(value, _SCALARS):
        kind = "None" if value is None else type(value).__name__
        raise KeyResolutionError(
            f"key template {template!r} resolved a placeholder to {kind}; keys take scalars "
            "(str, int, float, bool, Decimal, UUID, date/datetime/time, Enum). "
            "Use item access such as {0[id]} to pick a scalar out of a dict."
        )
    if isinstance(value, enum.Enum):
        value = value.value
    if format_spec:
        return format(value, format_spec)
    return str(value)


def resolve_template(template: str, call: BoundCall) -> str:
    """Return ``template`` resolved against ``call``.

    Raises:
        KeyResolutionError: a placeholder names a missing argument or index,
            resolves to ``None`` or a non-scalar, or the result is longer than
            :data:`MAX_KEY_LENGTH`.
    """
    try:
        key = _KeyFormatter(call, template).format(template)
    except ValueError as exc:
        if isinstance(exc, KeyResolutionError):
            raise
        raise KeyResolutionError(f"key template {template!r} is malformed: {exc}") from exc
    return check_key(key)


def check_key(key: Any) -> str:
    """Return ``key`` if it is a usable key text, else raise :class:`KeyResolutionError`."""
    if not isinstance(key, str):
        raise KeyResolutionError(f"a key must be a str, got {type(key).__name__} ({key!r}).")
    if len(key) > MAX_KEY_LENGTH:
        raise KeyResolutionError(
            f"key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}."
        )
    if "\x00" in key:
        raise KeyResolutionError("a key may not contain a NUL character (\\x00).")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise KeyResolutionError(f"a key must be valid Unicode text ({exc.reason}).") from exc
    return key


def resolve_key(
    spec: str | Callable[..., Any],
    call: BoundCall,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    option: str = "key",
) -> str | None:
    """Resolve a key option: a template, or a callable taking the task's arguments.

    A callable may return ``None`` to opt this call out of keying.

    Args:
        option: the option's name for messages (``"debounce_key"``, ``"unique_key"``).

    Raises:
        KeyResolutionError: the template does not resolve, the key is not
            usable text (:func:`check_key`), or the callable raised (chained
            from its exception, naming ``option`` and the callable).
    """
    if callable(spec):
        try:
            key = spec(*args, **kwargs)
        except Exception as exc:
            raise KeyResolutionError(
                f"the {option} callable {_callable_name(spec)} raised {type(exc).__name__}: {exc}"
            ) from exc
        return None if key is None else check_key(key)
    return resolve_template(spec, call)


def _callable_name(spec: Callable[..., Any]) -> str:
    """Return ``module.qualname`` of a key callable (its ``repr`` when it has none)."""
    name = getattr(spec, "__qualname__", None)
    module = getattr(spec, "__module__", None)
    if not isinstance(name, str):
        return repr(spec)
    return f"{module}.{name}" if isinstance(module, str) else name


def default_key(call: BoundCall) -> str:
    """Return the stable hash key of a call's bound arguments (§3, no ``debounce_key``)."""
    try:
        canonical = json.dumps(
            [encode(_plain(list(call.positional))), encode(_plain(dict(call.named)))],
            sort_keys=True,
            separators=(",", ":"),
        )
    except PayloadError as exc:
        raise PayloadError(f"cannot derive the default debounce key: {exc}") from exc
    return "args:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    """Replace Enum members by their values (a parameter's Enum default is a scalar, §3)."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def window_hash(task_name: str, key: str) -> str:
    """Return the 64-hex-digit identity of the window (task name, key) (§3)."""
    return hashlib.sha256(f"{task_name}\x00{key}".encode()).hexdigest()
