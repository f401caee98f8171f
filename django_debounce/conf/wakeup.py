"""The parsed wake-up settings: ``DEBOUNCE_WAKEUP`` and ``DEBOUNCE_REDIS`` (decisions 80, 82).

A leaf: the settings table (:mod:`django_debounce.conf.table`) reads
``DEBOUNCE_WAKEUP`` through :func:`parse_wakeup` and the settings check reports
what it raises (E020); E021 and E022, what a valid value needs of the database
and of ``DEBOUNCE_REDIS``, are :mod:`django_debounce.checks.wakeup`.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import ConfigurationError

#: The values ``DEBOUNCE_WAKEUP`` accepts (check E020).
WAKEUP_MODES = ("auto", "notify", "redis", "poll")


def parse_wakeup(value: Any) -> str:
    """Validate ``DEBOUNCE_WAKEUP`` and return it (decision 80).

    Args:
        value: one of :data:`WAKEUP_MODES`: ``"auto"`` (LISTEN/NOTIFY on
            PostgreSQL, else the Redis wake-up when ``DEBOUNCE_REDIS`` is set,
            else polling), ``"notify"``, ``"redis"`` or ``"poll"``.

    Raises:
        ConfigurationError: any other value.
    """
    if value not in WAKEUP_MODES:
        raise ConfigurationError(
            f"DEBOUNCE_WAKEUP={value!r} is not a wake-up: it must be one of "
            f"{', '.join(map(repr, WAKEUP_MODES))}."
        )
    return str(value)


__all__ = ["WAKEUP_MODES", "parse_wakeup"]
