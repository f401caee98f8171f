"""Checks of single option values, shared by declarations, calls and commands (contract §2, §6).

Each returns the value it accepts or raises
:class:`~django_debounce.exceptions.ConfigurationError` naming it; none runs SQL.
:mod:`django_debounce.options` decides which of them run, and in what order.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from . import codec
from .breaker import CircuitBreaker
from .conf import settings
from .conf.durations import parse_duration
from .exceptions import ConfigurationError, PayloadError
from .rates import parse_rate

#: ``debounce_edge`` values: which calls of a burst run (decision 180).
EDGES = ("trailing", "leading", "both")

#: Longest task name (``Job.task_name`` is a ``CharField(max_length=255)``).
MAX_TASK_NAME_LENGTH = 255


def check_duration(value: object, name: str) -> timedelta:
    """Return an option's ``value`` as a duration, e.g. ``"5m"`` (§2); see :func:`parse_duration`.

    Raises:
        ConfigurationError: not a duration, not positive, or over 100 years.
    """
    return parse_duration(value, name=name)  # type: ignore[arg-type]  # checked by the parse


def check_priority(priority: object) -> int:
    """Return ``priority`` if it is an int in -100..100, else raise ``ConfigurationError``."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ConfigurationError(
            f"priority={priority!r} is out of range: give an integer from -100 to 100 "
            "(higher runs first, default 0)."
        )
    return priority


def check_queue(queue: object) -> str:
    """Return ``queue`` if it is a non-empty name of at most 100 characters.

    Raises:
        ConfigurationError: not a ``str``, empty, longer than the column's 100
            characters, surrounding spaces, or text no database can store (NUL,
            a lone surrogate).
    """
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > 100
        or queue != queue.strip()
        or not codec.is_storable_text(queue)
    ):
        raise ConfigurationError(
            f"queue={queue!r} must be a non-empty str of at most 100 characters, without "
            "surrounding spaces, NUL characters or lone surrogates."
        )
    return queue


def check_task_name(task_name: object) -> str:
    """Return ``task_name`` if it fits ``Job.task_name`` on every database.

    Checked when a task is declared and when ``enqueue("name", ...)`` names a
    task this process never imported, so a bad name is refused before any SQL.

    Raises:
        ConfigurationError: not a ``str``, empty, longer than 255 characters,
            or text no database can store (NUL, a lone surrogate).
    """
    if (
        not isinstance(task_name, str)
        or not task_name
        or len(task_name) > MAX_TASK_NAME_LENGTH
        or not codec.is_storable_text(task_name)
    ):
        shown = repr(task_name)
        if isinstance(task_name, str) and len(task_name) > 80:
            shown = f"{task_name[:60]!r}… ({len(task_name)} characters)"
        raise ConfigurationError(
            f"task name {shown} must be a non-empty str of at most "
            f"{MAX_TASK_NAME_LENGTH} characters, without NUL characters or lone surrogates."
        )
    return task_name


def check_window(window: timedelta, max_wait: timedelta | None, *, where: str) -> timedelta:
    """Return the max wait in force for ``window``, validating the pair (§2).

    Raises:
        ConfigurationError: no max wait is given and ``DEBOUNCE_DEFAULT_MAX_WAIT``
            is unset (an unbounded window starves the job), or the max wait is
            shorter than the window.
    """
    if max_wait is None:
        max_wait = settings.default_max_wait  # parsed by its row (check E002)
        if max_wait is None:
            raise ConfigurationError(
                f"{where}: debounce={window} needs debounce_max_wait= (or the "
                "DEBOUNCE_DEFAULT_MAX_WAIT setting): without a ceiling a steady stream of calls "
                "would push the run back forever."
            )
    if max_wait < window:
        raise ConfigurationError(
            f"{where}: debounce_max_wait={max_wait} is shorter than the window debounce={window}; "
            "the max wait must be at least the window."
        )
    return max_wait


def check_rate_per_key(where: str, rate: object, debounce_key: object) -> None:
    """Check a task's ``rate_limit_per_key`` (decision 189, §6).

    Raises:
        ConfigurationError: ``rate`` is not a str ``"N/period"``, or the task
            declares no ``debounce_key`` (the bucket is per debounce key).
    """
    if rate is None:
        return
    if not isinstance(rate, str):
        raise ConfigurationError(
            f"{where}: rate_limit_per_key={rate!r} must be a str 'N/period', e.g. '3/m', "
            "'1/h', '5/10s'."
        )
    parse_rate(rate, name="rate_limit_per_key")
    if debounce_key is None:
        raise ConfigurationError(
            f"{where}: rate_limit_per_key= gives each debounce key its own bucket; declare "
            "debounce_key= too (e.g. debounce_key='{0}'), or use rate_limit= for one bucket "
            "for the whole task."
        )


def check_flow_control(
    where: str,
    rate_limit: object,
    burst: object,
    concurrency: object,
    breaker: object,
) -> None:
    """Check a task's ``rate_limit``, ``rate_limit_burst``, ``concurrency`` and ``circuit_breaker`` (§6, §11).

    Raises:
        ConfigurationError: ``rate_limit`` is not ``"N/period"``;
            ``rate_limit_burst`` is given without ``rate_limit`` or is not an
            int ≥ 1; ``concurrency`` is not an int ≥ 1; ``circuit_breaker`` is
            not a :class:`~django_debounce.CircuitBreaker`.
    """
    if rate_limit is not None:
        if not isinstance(rate_limit, str):
            raise ConfigurationError(
                f"{where}: rate_limit={rate_limit!r} must be a str 'N/period', e.g. '10/s', "
                "'100/m', '5/10s'."
            )
        parse_rate(rate_limit)
    if burst is not None:
        if rate_limit is None:
            raise ConfigurationError(
                f"{where}: rate_limit_burst= sizes the bucket of a rate_limit=; give rate_limit= "
                "too, or drop rate_limit_burst=."
            )
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigurationError(
                f"{where}: rate_limit_burst={burst!r} must be an int >= 1 (the most "
                "jobs that may start at once; default: the N of rate_limit='N/period')."
            )
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ConfigurationError(
            f"{where}: concurrency={concurrency!r} must be an int >= 1 (the most jobs of this "
            "task running at once across the deployment), or None for no cap."
        )
    if breaker is not None and not isinstance(breaker, CircuitBreaker):
        raise ConfigurationError(
            f"{where}: circuit_breaker={breaker!r} must be a "
            "django_debounce.CircuitBreaker(failures=5, reset='1m')."
        )


def check_metadata(metadata: dict[str, object], where: str) -> None:
    """Refuse ``metadata`` a database would refuse or change, before any SQL runs.

    Plain JSON (str keys, finite floats) under the codec's limits on text, ints
    and depth, and a JSON text of at most ``DEBOUNCE_MAX_PAYLOAD_BYTES``.

    Raises:
        ConfigurationError: naming what is wrong and where.
    """
    try:
        codec.check_json(metadata, path="metadata")
    except PayloadError as exc:
        raise ConfigurationError(
            f"{where}: metadata must be plain JSON that every database stores: {exc}"
        ) from exc
    size = len(json.dumps(metadata))
    if size > settings.max_payload_bytes:
        raise ConfigurationError(
            f"{where}: metadata is {size:,} bytes of JSON; the limit is "
            f"{settings.max_payload_bytes:,} (DEBOUNCE_MAX_PAYLOAD_BYTES). Keep metadata to "
            "a few labels; store bulk data elsewhere."
        )


def checked_now(now: object, where: str) -> datetime:
    """Return ``now``, or ``timezone.now()`` for ``None``, as an action's instant (§4.7).

    Raises:
        ConfigurationError: ``now`` is not an aware ``datetime`` (a date, a naive
            datetime, a string, a number); nothing has been written.
    """
    from django.utils import timezone  # noqa: PLC0415 (kept out of the module's import)

    if now is None:
        return timezone.now()
    if not isinstance(now, datetime) or timezone.is_naive(now):
        raise ConfigurationError(
            f"{where}: now= takes an aware datetime (e.g. timezone.now()), got {now!r}; "
            "instants are compared as aware UTC (USE_TZ = True)."
        )
    return now


def check_alias(using: object, where: str) -> None:
    """Refuse a database alias that is not in ``DATABASES`` (``None``: the router's choice).

    Raises:
        ConfigurationError: naming the alias and the ones configured.
    """
    from django.db import connections  # noqa: PLC0415

    if using is not None and using not in connections.settings:
        raise ConfigurationError(
            f"{where}: using={using!r} is not a database alias of this project; "
            f"DATABASES has {sorted(connections.settings)}."
        )


def did_you_mean(unknown: Sequence[str], accepted: Iterable[str]) -> str:
    """Return the "did you mean" part of an unknown-option message, or ``""`` when nothing is close.

    Each unknown name is matched with :func:`difflib.get_close_matches` (as
    Django's ``check`` and ``manage.py`` do for settings and commands) against
    ``accepted``. One unknown name: ``" (did you mean 'debounce_max_wait'?)"``;
    several: ``" (did you mean 'a' for 'x', 'b' for 'y'?)"`` (only those with a
    close match).
    """
    choices = sorted(accepted)
    pairs = [(name, difflib.get_close_matches(name, choices, n=1)) for name in unknown]
    found = [(name, meant[0]) for name, meant in pairs if meant]
    if not found:
        return ""
    if len(unknown) == 1:
        return f" (did you mean {found[0][1]!r}?)"
    return " (did you mean " + ", ".join(f"{meant!r} for {name!r}" for name, meant in found) + "?)"


def check_edge(edge: object, debounced: bool, sets_payload: bool, where: str) -> str:
    """Return a task's ``debounce_edge`` (one of :data:`EDGES`) if it fits its other options.

    Args:
        edge: the declared value.
        debounced: whether the task (or call) has a ``debounce`` window.
        sets_payload: whether ``debounce_replace_payload`` or ``debounce_merge`` is set.
        where: the message prefix naming the task or call.

    Raises:
        ConfigurationError: an unknown value (the message names the allowed
            ones); an edge other than ``"trailing"`` without ``debounce``;
            ``"leading"`` with a payload option (its swallowed calls never
            run, so the option could never apply; decision 180).
    """
    if edge not in EDGES:
        raise ConfigurationError(
            f"{where}: debounce_edge={edge!r} is unknown; use 'trailing' (run after the burst "
            "goes quiet), 'leading' (run its first call at once) or 'both'."
        )
    if edge != "trailing" and not debounced:
        raise ConfigurationError(
            f"{where}: debounce_edge={edge!r} without debounce=; an edge belongs to a debounce "
            "window, so give debounce= (and debounce_max_wait=) too."
        )
    if edge == "leading" and sets_payload:
        raise ConfigurationError(
            f"{where}: debounce_edge='leading' runs the first call of a burst and swallows the "
            "rest, so debounce_replace_payload/debounce_merge would never apply; use "
            "debounce_edge='both' to run a trailing call with the newest or merged payload."
        )
    return edge  # type: ignore[return-value]
