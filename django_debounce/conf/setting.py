"""One row of the settings table: a setting's name, default, parser, check id and hint.

A :class:`Setting` is declared once, as a class attribute of
:class:`django_debounce.conf.table.Settings` (after Celery's ``app/defaults.py``
table), and is at once the row the system checks loop over and the typed,
cached attribute the package reads: ``settings.lease`` parses
``DEBOUNCE_LEASE`` through its row at the first read and keeps the result in
the instance's ``__dict__``, so every later read is a plain attribute lookup
(``settings.codel`` is read on every claim). Django's ``setting_changed``
signal naming the setting drops the kept value (:mod:`django_debounce.conf.table`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from django.conf import settings as django_settings

T = TypeVar("T")

#: The prefix of the package's settings (their rows' names).
PREFIX = "DEBOUNCE_"


@dataclass(eq=False)
class Setting(Generic[T]):
    """A setting's row: declared once, read through it everywhere, checked from it.

    Used as a class attribute (a non-data descriptor): reading it on an
    instance parses the setting and stores the value on the instance under
    the same attribute name, so the next read does not reach the descriptor.
    A value that does not parse is not kept: each read raises again.

    Attributes:
        name: the Django setting, e.g. ``"DEBOUNCE_LEASE"``.
        default: the value when the project does not set it (documented in
            docs/reference/settings.md).
        parse: ``parse(value) -> T``; raises
            :class:`~django_debounce.exceptions.ConfigurationError` whose message
            names the setting and says what is wrong.
        check: the system check id that reports a value ``parse`` refuses,
            e.g. ``"E004"`` (docs/reference/checks.md; never renumbered), or
            ``None`` for Django's own ``USE_TZ``, which a named check judges.
        hint: the check's hint: what a good value looks like.
        attr: the attribute name on the typed object (set by the class body).
    """

    name: str
    default: Any
    parse: Callable[[Any], T]
    check: str | None = None
    hint: str | None = None
    attr: str = field(default="", init=False)

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @property
    def key(self) -> str:
        """The name without ``DEBOUNCE_`` (``"LEASE"``), as :data:`~django_debounce.conf.DEFAULTS` keys it."""
        return self.name.removeprefix(PREFIX)

    @property
    def check_id(self) -> str:
        """The full check id, e.g. ``"django_debounce.E004"`` (``""`` without a check)."""
        return f"django_debounce.{self.check}" if self.check else ""

    def raw(self) -> Any:
        """Return the project's value of the setting, or :attr:`default` when it sets none."""
        return getattr(django_settings, self.name, self.default)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Setting[T] | T:
        if obj is None:
            return self
        value = self.parse(self.raw())
        obj.__dict__[self.attr] = value
        return value


def optional(parse: Callable[[Any], T]) -> Callable[[Any], T | None]:
    """Return a parser that takes ``None`` as it is and gives anything else to ``parse``."""

    def parse_optional(value: Any) -> T | None:
        return None if value is None else parse(value)

    return parse_optional


__all__ = ["PREFIX", "Setting", "optional"]
