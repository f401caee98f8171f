"""System checks of the settings table and the database (ids ``django_debounce.E0nn``/``W0nn``).

:func:`check_settings` is one loop over the table's rows
(:data:`django_debounce.conf.ROWS`): each row's setting is read through the
typed object, as the package reads it, and a value its parser refuses is
reported under the row's id with the row's hint (decision 171). What a setting
needs of another one (E003, E008), Django's ``USE_TZ`` (E011), the database
options (W001, W002) and an unknown ``DEBOUNCE_*`` name (W003) are named
checks here; the wake-up's, Redis's and each integration's live beside their
concern. Every id is listed in docs/reference/checks.md and never renumbered.
Importing this module registers nothing: :func:`django_debounce.checks.register_checks`
does, from ``DjangoDebounceConfig.ready``.
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections

from ..conf import ROWS, Setting, Settings, settings
from ..exceptions import ConfigurationError

#: Pairs of duration rows whose second must be at least the first, with the id and hint
#: reported when it is shorter (checked only when both parse; docs/reference/checks.md).
_AT_LEAST: tuple[tuple[Setting[Any], Setting[Any], str, str], ...] = (
    (
        Settings.default_window,
        Settings.default_max_wait,
        "E003",
        "The max wait caps the window, so it must be at least as long.",
    ),
    (
        Settings.min_backoff,
        Settings.max_backoff,
        "E008",
        "Raise DEBOUNCE_MAX_BACKOFF or lower DEBOUNCE_MIN_BACKOFF.",
    ),
)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Parse every row of the settings table; report each refusal, then E003 and E008.

    Each ``DEBOUNCE_*`` setting is read through its row's attribute of
    :data:`django_debounce.conf.settings`, so the check passes exactly what
    the worker and every enqueue accept. A refused value is an ``Error``
    with the parser's message (it names the setting), the row's hint and
    its id (E001, E002, E004-E007, E009, E010, E012-E016, E020, E025-E027,
    E029, E035, E040, E041, E044-E047, E055, E056).
    """
    errors: list[CheckMessage] = []
    parsed: dict[str, Any] = {}
    for row in ROWS:
        try:
            parsed[row.attr] = getattr(settings, row.attr)
        except ConfigurationError as exc:
            errors.append(Error(str(exc), hint=row.hint, id=row.check_id))
    for shorter, longer, code, hint in _AT_LEAST:
        low, high = parsed.get(shorter.attr), parsed.get(longer.attr)
        if low is not None and high is not None and high < low:
            errors.append(
                Error(
                    f"{longer.name} ({high}) is shorter than {shorter.name} ({low}).",
                    hint=hint,
                    id=f"django_debounce.{code}",
                )
            )
    return errors


def check_database_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Check database OPTIONS without connecting (W001, W002)."""
    return check_database_settings()


def check_database_settings() -> list[CheckMessage]:
    """Return W001 (SQLite not IMMEDIATE) and W002 (MySQL/MariaDB not READ COMMITTED)."""
    messages: list[CheckMessage] = []
    for alias in connections:
        conn = connections[alias]
        options = conn.settings_dict.get("OPTIONS", {}) or {}
        if conn.vendor == "sqlite":
            if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
                messages.append(
                    Warning(
                        f'Database {alias!r} is SQLite without "transaction_mode": "IMMEDIATE".',
                        hint=(
                            "Deferred transactions take the write lock only at their first write, "
                            "so a web process and a worker racing on one window fail with "
                            "'database is locked' instead of waiting their turn. Add "
                            'OPTIONS={"transaction_mode": "IMMEDIATE", "timeout": 20} (Django '
                            "5.1+; the timeout is how many seconds a writer waits for the lock)."
                        ),
                        id="django_debounce.W001",
                    )
                )
        elif conn.vendor == "mysql":
            level = str(options.get("isolation_level", "")).lower()
            if level != "read committed":
                messages.append(
                    Warning(
                        f"Database {alias!r} is MySQL/MariaDB without isolation_level 'read committed'.",
                        hint=(
                            "At REPEATABLE READ a producer can miss a window another committed; set "
                            'OPTIONS={"isolation_level": "read committed"}.'
                        ),
                        id="django_debounce.W002",
                    )
                )
    return messages


def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E011: the package's one clock (§4.7) needs ``USE_TZ = True``."""
    if settings.use_tz:
        return []
    return [
        Error(
            "django_debounce needs USE_TZ = True.",
            hint=(
                "Deadlines, leases and backoff are compared as aware UTC instants (see 'The "
                "clock' in the docs' semantics page). With USE_TZ = False they are local wall-clock times, and a daylight-"
                "saving change moves every lease by an hour, letting two workers run one job."
            ),
            id="django_debounce.E011",
        )
    ]


def check_unknown_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W003: a ``DEBOUNCE_*`` setting the package does not know (most likely a typo).

    A misspelled name (``DEBOUNCE_QUEUE``, ``DEBOUNCE_DEAD_LETTERS_AUTO_RETRY``) is
    otherwise ignored without a word, and the feature it meant to turn on stays off.
    """
    known = {row.name for row in ROWS}
    messages: list[CheckMessage] = []
    for name in sorted(dir(django_settings)):
        if not name.startswith("DEBOUNCE_") or name in known:
            continue
        meant = _suggestion(name)
        messages.append(
            Warning(
                f"{name} is not a django-debounce setting; it is ignored.",
                hint=(f"Did you mean {meant}? " if meant else "")
                + "The settings are listed in docs/reference/settings.md.",
                id="django_debounce.W003",
            )
        )
    return messages


#: How alike (difflib's ratio, 0..1) the part after ``DEBOUNCE_`` must be to count as a typo:
#: a dropped, doubled or swapped letter or a plural scores 0.8-0.98; names that only share
#: a word (``MAX_WORKERS`` and ``MAX_RETRIES``: 0.73) or a few letters score lower.
_CLOSE = 0.75


def _suggestion(name: str) -> str | None:
    """Return the ``DEBOUNCE_*`` setting that ``name`` most likely misspells, or ``None``.

    Args:
        name: an unknown setting name starting with ``DEBOUNCE_``.

    Compared without the shared prefix (it would make every pair look alike):
    the known name spelled closest, if its ratio is at least :data:`_CLOSE`
    (``DEBOUNCE_QUEUE`` -> ``DEBOUNCE_QUEUES``); else the only known name
    whose words run inside ``name``'s or the other way round
    (``DEBOUNCE_WINDOW`` -> ``DEBOUNCE_DEFAULT_WINDOW``). An unrelated name
    (``DEBOUNCE_BROKER_URL``, ``DEBOUNCE_BACKEND``) gets no suggestion (W003,
    docs/reference/checks.md).
    """
    tail = name.removeprefix("DEBOUNCE_")
    keys = sorted(row.key for row in ROWS)
    close = difflib.get_close_matches(tail, keys, n=1, cutoff=_CLOSE)
    if close:
        return f"DEBOUNCE_{close[0]}"
    words = tail.split("_")
    inside = [
        known
        for known in keys
        if _runs_inside(known.split("_"), words) or _runs_inside(words, known.split("_"))
    ]
    return f"DEBOUNCE_{inside[0]}" if len(inside) == 1 else None


def _runs_inside(part: list[str], whole: list[str]) -> bool:
    """True if the words ``part`` appear in ``whole`` one after another."""
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))
