"""System checks for the ``DEBOUNCE_*`` settings and the database (ids ``django_debounce.E0nn``/``W0nn``).

Every id is listed in docs/reference/checks.md. Ids are never renumbered.
Importing this module registers nothing: :func:`django_debounce.checks.register_checks`
does, from ``DjangoDebounceConfig.ready``.
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections

from ..conf import DEFAULTS, parse_auto_retry, parse_max_payload_bytes, parse_queues
from ..conf.durations import parse_duration
from ..conf.numbers import (
    parse_enqueue_retries,
    parse_flush_interval,
    parse_max_retries,
    parse_poll_interval,
    parse_prefetch,
)
from ..conf.retention import parse_prune
from ..exceptions import ConfigurationError

_DURATIONS = {
    "DEFAULT_WINDOW": "E001",
    "DEFAULT_MAX_WAIT": "E002",
    "LEASE": "E004",
    "MIN_BACKOFF": "E005",
    "MAX_BACKOFF": "E006",
    "SHUTDOWN_GRACE": "E007",
}


def _setting(name: str) -> Any:
    return getattr(django_settings, f"DEBOUNCE_{name}", DEFAULTS[name])


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate every ``DEBOUNCE_*`` setting (E001–E010)."""
    errors: list[CheckMessage] = []
    parsed = {}
    for name, code in _DURATIONS.items():
        value = _setting(name)
        if value is None and name.startswith("DEFAULT_"):
            continue
        try:
            parsed[name] = parse_duration(value, name=f"DEBOUNCE_{name}")
        except ConfigurationError as exc:
            errors.append(
                Error(
                    str(exc),
                    hint=f"Set DEBOUNCE_{name} to seconds, a timedelta, or a string like '10s' or '5m'.",
                    id=f"django_debounce.{code}",
                )
            )
    window, max_wait = parsed.get("DEFAULT_WINDOW"), parsed.get("DEFAULT_MAX_WAIT")
    if window is not None and max_wait is not None and max_wait < window:
        errors.append(
            Error(
                f"DEBOUNCE_DEFAULT_MAX_WAIT ({max_wait}) is shorter than DEBOUNCE_DEFAULT_WINDOW ({window}).",
                hint="The max wait caps the window, so it must be at least as long.",
                id="django_debounce.E003",
            )
        )
    low, high = parsed.get("MIN_BACKOFF"), parsed.get("MAX_BACKOFF")
    if low is not None and high is not None and high < low:
        errors.append(
            Error(
                f"DEBOUNCE_MAX_BACKOFF ({high}) is shorter than DEBOUNCE_MIN_BACKOFF ({low}).",
                hint="Raise DEBOUNCE_MAX_BACKOFF or lower DEBOUNCE_MIN_BACKOFF.",
                id="django_debounce.E008",
            )
        )
    try:
        parse_max_retries(_setting("MAX_RETRIES"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint=(
                    "It counts retries after the first attempt; 0 means run once. Every enqueue "
                    "of a task without its own max_retries uses it, under the same rule."
                ),
                id="django_debounce.E009",
            )
        )
    try:
        parse_poll_interval(_setting("POLL_INTERVAL"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint="How long an idle worker sleeps between polls, e.g. DEBOUNCE_POLL_INTERVAL = 1.0.",
                id="django_debounce.E010",
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
    if getattr(django_settings, "USE_TZ", True):
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


def check_queues(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E012: ``DEBOUNCE_QUEUES`` must parse (CoDel target/interval per queue, §6, §11)."""
    try:
        parse_queues(_setting("QUEUES"))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint=(
                    'Use {"queue": {"codel": {"target": "500ms", "interval": "5s"}}}: both '
                    "durations longer than zero, the target shorter than the interval "
                    "(RFC 8289 suggests 5-10% of it), no other keys."
                ),
                id="django_debounce.E012",
            )
        ]
    return []


def check_dead_letter_auto_retry(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E013: ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` must be None or parse (§8, §11)."""
    try:
        parse_auto_retry(_setting("DEAD_LETTER_AUTO_RETRY"))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint=(
                    'Use None (off) or {"every": "10m", "min_age": "10m", "max_retries": 3}: '
                    "every and min_age durations longer than zero, max_retries an int >= 1, "
                    "no other keys."
                ),
                id="django_debounce.E013",
            )
        ]
    return []


def check_prune(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E045: ``DEBOUNCE_PRUNE`` must be None or parse (issue #11, decision 112)."""
    try:
        parse_prune(_setting("PRUNE"))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint=(
                    'Use None (off) or {"older_than": "7d", "every": "1h", "batch_size": 1000, '
                    '"dead_letters": False}: durations longer than zero, batch_size an int '
                    ">= 1, dead_letters a bool, no other keys."
                ),
                id="django_debounce.E045",
            )
        ]
    return []


def check_max_payload_bytes(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E014: ``DEBOUNCE_MAX_PAYLOAD_BYTES`` must be an int of at least 1024."""
    try:
        parse_max_payload_bytes(_setting("MAX_PAYLOAD_BYTES"))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint=(
                    "It caps the JSON text of a job's arguments, metadata and result, in bytes. "
                    "The default, 1048576 (1 MiB), leaves a wide margin under MariaDB's default "
                    "max_allowed_packet of 16 MiB; keep it below your database's packet limit."
                ),
                id="django_debounce.E014",
            )
        ]
    return []


def check_enqueue_retries(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E015: ``DEBOUNCE_ENQUEUE_RETRIES`` must be an int (values below 1 count as 1, §4.4)."""
    try:
        parse_enqueue_retries(_setting("ENQUEUE_RETRIES"))
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint=(
                    "It counts the attempts an enqueue makes when it loses a race or waits on "
                    "a lock before it raises EnqueueContentionError, e.g. "
                    "DEBOUNCE_ENQUEUE_RETRIES = 20 (the default; values below 1 count as 1)."
                ),
                id="django_debounce.E015",
            )
        ]
    return []


def check_backoff_jitter(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E016: ``DEBOUNCE_BACKOFF_JITTER`` must be True or False (§7)."""
    value = _setting("BACKOFF_JITTER")
    if not isinstance(value, bool):
        return [
            Error(
                f"DEBOUNCE_BACKOFF_JITTER={value!r} is not True or False.",
                hint=(
                    "True (the default) draws each retry's delay from [base / 2, base] so jobs "
                    "that failed together spread out; False waits exactly base."
                ),
                id="django_debounce.E016",
            )
        ]
    return []


def check_drain_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E055: ``DEBOUNCE_PREFETCH`` is an int >= 0; E056: ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL`` a number >= 0."""
    errors: list[CheckMessage] = []
    try:
        parse_prefetch(_setting("PREFETCH"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint=(
                    "It counts the jobs a busy worker claims beyond its free threads, e.g. "
                    "DEBOUNCE_PREFETCH = 100 (the default); 0 claims only for free threads."
                ),
                id="django_debounce.E055",
            )
        )
    try:
        parse_flush_interval(_setting("SUCCESS_FLUSH_INTERVAL"))
    except ConfigurationError as exc:
        errors.append(
            Error(
                str(exc),
                hint=(
                    "It is the longest a finished job's success waits for its batched write, "
                    "e.g. 0.1 (the default); 0 writes each success at once. Keep it well "
                    "below DEBOUNCE_LEASE."
                ),
                id="django_debounce.E056",
            )
        )
    return errors


def check_unknown_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W003: a ``DEBOUNCE_*`` setting the package does not know (most likely a typo).

    A misspelled name (``DEBOUNCE_QUEUE``, ``DEBOUNCE_DEAD_LETTERS_AUTO_RETRY``) is
    otherwise ignored without a word, and the feature it meant to turn on stays off.
    """
    known = {f"DEBOUNCE_{name}" for name in DEFAULTS}
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
    close = difflib.get_close_matches(tail, sorted(DEFAULTS), n=1, cutoff=_CLOSE)
    if close:
        return f"DEBOUNCE_{close[0]}"
    words = tail.split("_")
    inside = [
        known
        for known in sorted(DEFAULTS)
        if _runs_inside(known.split("_"), words) or _runs_inside(words, known.split("_"))
    ]
    return f"DEBOUNCE_{inside[0]}" if len(inside) == 1 else None


def _runs_inside(part: list[str], whole: list[str]) -> bool:
    """True if the words ``part`` appear in ``whole`` one after another."""
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))
