"""The one reader of ``django.conf.settings`` for ``DEBOUNCE_*`` names.

Every setting is read and parsed at its first attribute access and kept
(``settings.codel`` is read on every claim, ``settings.use_tz`` on every
enqueue); Django's ``setting_changed`` signal naming a ``DEBOUNCE_*`` setting
or ``USE_TZ`` forgets what was kept (``override_settings`` sends it), so tests
that change settings see the new values. Validation lives in
:mod:`django_debounce.checks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .durations import DurationLike, parse_duration
from .exceptions import ConfigurationError
from .executor_settings import parse_celery_queues, parse_executor

#: Defaults for every ``DEBOUNCE_*`` setting (documented in docs/reference/settings.md).
DEFAULTS: dict[str, Any] = {
    # Project-wide window for @debounced_task without debounce= (§2). None: required.
    "DEFAULT_WINDOW": None,
    # Project-wide max wait for debounced tasks without debounce_max_wait= (§2).
    "DEFAULT_MAX_WAIT": None,
    # How long a claim holds a job before another worker may reclaim it (§7).
    "LEASE": "60s",
    # Default retry policy (§7): retries after the first attempt, backoff bounds.
    "MAX_RETRIES": 3,
    "MIN_BACKOFF": "1s",
    "MAX_BACKOFF": "1h",
    "BACKOFF_JITTER": True,
    # Worker loop.
    "POLL_INTERVAL": 1.0,
    "SHUTDOWN_GRACE": "30s",
    # How many times an enqueue retries a lost race or a lock wait (§4.4).
    "ENQUEUE_RETRIES": 20,
    # Per-queue options, e.g. {"default": {"codel": {...}}} (§11).
    "QUEUES": {},
    "DEAD_LETTER_AUTO_RETRY": None,
    # Largest JSON text of one job's args + kwargs (and of its metadata, and of a
    # result), in bytes (docs/reference/settings.md; decision 29 in docs/decisions.md).
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Who runs jobs: "worker" (run_debounce_worker) or "celery" (docs/howto/celery.md).
    "EXECUTOR": "worker",
    # The Celery executor: debounce queue -> Celery queue, and the hand-off's lease.
    "CELERY_QUEUES": {},
    "CELERY_HANDOFF_LEASE": "5m",
    # Dotted path of the Celery app to publish with; None: Celery's current app.
    "CELERY_APP": None,
}

#: The smallest ``DEBOUNCE_MAX_PAYLOAD_BYTES`` accepted (check E014): 1 KiB.
MIN_PAYLOAD_BYTES = 1024


@dataclass(frozen=True)
class CodelSettings:
    """One queue's CoDel parameters (§6, §11; RFC 8289 §4 ``TARGET``/``INTERVAL``).

    Attributes:
        target: the acceptable standing wait of a job, from its ``run_at`` to
            its claim (RFC ``TARGET``).
        interval: how long the wait must stay above ``target`` before the
            queue starts shedding, and the base of the drop spacing
            ``interval / sqrt(count)`` (RFC ``INTERVAL``). Longer than ``target``.
    """

    target: timedelta
    interval: timedelta


#: Keys a ``DEBOUNCE_QUEUES`` entry may hold, and keys of its ``"codel"`` dict.
QUEUE_KEYS = ("codel",)
CODEL_KEYS = ("target", "interval")


def parse_queues(value: Any) -> dict[str, CodelSettings]:
    """Validate ``DEBOUNCE_QUEUES`` and return the CoDel settings of each queue that has them.

    Args:
        value: the setting, e.g. ``{"default": {"codel": {"target": "500ms",
            "interval": "5s"}}}``: queue name -> options dict. The only option is
            ``"codel"``: a dict with the durations ``"target"`` and ``"interval"``
            (both required), or ``None`` for off. ``None`` for the whole setting
            means no per-queue options.

    Returns:
        Queue name -> :class:`CodelSettings`, for queues with CoDel on only.

    Raises:
        ConfigurationError: the setting is not a dict of dicts; a queue name is
            not a non-empty string; an unknown option key; ``"codel"`` is not a
            dict, misses ``target``/``interval`` or has other keys; a duration is
            invalid or not positive; ``target`` is not shorter than ``interval``.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"DEBOUNCE_QUEUES={value!r} must be a dict of queue name -> options, e.g. "
            '{"default": {"codel": {"target": "500ms", "interval": "5s"}}}.'
        )
    result: dict[str, CodelSettings] = {}
    for queue, options in value.items():
        where = f"DEBOUNCE_QUEUES[{queue!r}]"
        if not isinstance(queue, str) or not queue or len(queue) > 100:
            raise ConfigurationError(
                f"{where}: a queue name must be a non-empty str of at most 100 characters."
            )
        if not isinstance(options, Mapping):
            raise ConfigurationError(
                f'{where}={options!r} must be a dict of options, e.g. {{"codel": {{...}}}}.'
            )
        unknown = sorted(str(key) for key in options if key not in QUEUE_KEYS)
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown option(s) {unknown}; accepted: {', '.join(QUEUE_KEYS)}."
            )
        codel = options.get("codel")
        if codel is None:
            continue
        if not isinstance(codel, Mapping):
            raise ConfigurationError(
                f'{where}["codel"]={codel!r} must be a dict like '
                '{"target": "500ms", "interval": "5s"}, or None for off.'
            )
        unknown = sorted(str(key) for key in codel if key not in CODEL_KEYS)
        missing = [key for key in CODEL_KEYS if key not in codel]
        if unknown or missing:
            raise ConfigurationError(
                f'{where}["codel"] needs exactly the keys target and interval '
                f"(missing: {missing or 'none'}; unknown: {unknown or 'none'})."
            )
        target = parse_duration(codel["target"], name=f'{where}["codel"]["target"]')
        interval = parse_duration(codel["interval"], name=f'{where}["codel"]["interval"]')
        if target >= interval:
            raise ConfigurationError(
                f'{where}["codel"]: target ({target}) must be shorter than interval ({interval}); '
                "RFC 8289 suggests a target of 5–10% of the interval."
            )
        result[queue] = CodelSettings(target=target, interval=interval)
    return result


def parse_max_payload_bytes(value: Any) -> int:
    """Validate ``DEBOUNCE_MAX_PAYLOAD_BYTES`` and return it.

    Args:
        value: the setting, an ``int`` number of bytes, at least
            :data:`MIN_PAYLOAD_BYTES` (1024).

    Raises:
        ConfigurationError: not an ``int`` (a ``bool`` or a string counts as
            wrong), or below 1024.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_PAYLOAD_BYTES:
        raise ConfigurationError(
            f"DEBOUNCE_MAX_PAYLOAD_BYTES={value!r} must be an int of at least "
            f"{MIN_PAYLOAD_BYTES} (bytes of JSON text), e.g. 1048576 for 1 MiB."
        )
    return value


#: Every parsed value, by setting name, kept until ``setting_changed`` names the setting.
_cache: dict[str, Any] = {}

_T = TypeVar("_T")


def _forget(*, setting: str, **kwargs: Any) -> None:
    """Drop the parsed values when a ``DEBOUNCE_*`` setting or ``USE_TZ`` changes."""
    if setting == "USE_TZ" or setting.startswith("DEBOUNCE_"):
        _cache.clear()


setting_changed.connect(_forget, dispatch_uid="django_debounce.conf")


class Settings:
    """Lazy, typed view of the ``DEBOUNCE_*`` settings.

    Each attribute reads and parses its setting at its first access and keeps
    the result; Django's ``setting_changed`` signal (which ``override_settings``
    and pytest-django's ``settings`` fixture send) forgets every kept value, so
    the next access reads the new one. A setting that does not parse raises
    at every access (nothing is kept); ``manage.py check`` reports it first.
    """

    def _get(self, name: str) -> Any:
        return getattr(django_settings, f"DEBOUNCE_{name}", DEFAULTS[name])

    def _kept(self, name: str, parse: Callable[[Any], _T]) -> _T:
        """Return ``parse(DEBOUNCE_<name>)``, parsed once until the setting changes."""
        try:
            value: _T = _cache[name]
        except KeyError:
            value = _cache[name] = parse(self._get(name))
        return value

    def _duration(self, name: str) -> timedelta:
        return self._kept(name, lambda value: parse_duration(value, name=f"DEBOUNCE_{name}"))

    @property
    def default_window(self) -> DurationLike | None:
        """``DEBOUNCE_DEFAULT_WINDOW``: window for ``@debounced_task`` without ``debounce=``."""
        value: DurationLike | None = self._get("DEFAULT_WINDOW")
        return value

    @property
    def default_max_wait(self) -> DurationLike | None:
        """``DEBOUNCE_DEFAULT_MAX_WAIT``: max wait for debounced tasks that give none."""
        value: DurationLike | None = self._get("DEFAULT_MAX_WAIT")
        return value

    @property
    def lease(self) -> timedelta:
        """``DEBOUNCE_LEASE``: lease length of a claimed job (default 60 s)."""
        return self._duration("LEASE")

    @property
    def max_retries(self) -> int:
        """``DEBOUNCE_MAX_RETRIES``: default retries after the first attempt (default 3)."""
        return self._kept("MAX_RETRIES", int)

    @property
    def min_backoff(self) -> timedelta:
        """``DEBOUNCE_MIN_BACKOFF``: delay before the first retry (default 1 s)."""
        return self._duration("MIN_BACKOFF")

    @property
    def max_backoff(self) -> timedelta:
        """``DEBOUNCE_MAX_BACKOFF``: cap on the retry delay (default 1 h)."""
        return self._duration("MAX_BACKOFF")

    @property
    def backoff_jitter(self) -> bool:
        """``DEBOUNCE_BACKOFF_JITTER``: spread retries with equal jitter, delay in [base/2, base] (default True)."""
        return self._kept("BACKOFF_JITTER", bool)

    @property
    def poll_interval(self) -> float:
        """``DEBOUNCE_POLL_INTERVAL``: seconds between polls of an idle worker (default 1.0)."""
        return self._kept("POLL_INTERVAL", float)

    @property
    def shutdown_grace(self) -> timedelta:
        """``DEBOUNCE_SHUTDOWN_GRACE``: how long SIGTERM waits for running jobs (default 30 s)."""
        return self._duration("SHUTDOWN_GRACE")

    @property
    def enqueue_retries(self) -> int:
        """``DEBOUNCE_ENQUEUE_RETRIES``: attempts before ``EnqueueContentionError`` (default 20)."""
        return self._kept("ENQUEUE_RETRIES", int)

    @property
    def max_payload_bytes(self) -> int:
        """``DEBOUNCE_MAX_PAYLOAD_BYTES``: largest JSON text of a job's payload (default 1 MiB).

        Raises:
            ConfigurationError: the setting is invalid (see :func:`parse_max_payload_bytes`).
        """
        return self._kept("MAX_PAYLOAD_BYTES", parse_max_payload_bytes)

    @property
    def use_tz(self) -> bool:
        """Django's ``USE_TZ``: the package needs it True (check E011; §4.7).

        Kept like the ``DEBOUNCE_*`` values, so the check every enqueue makes
        costs a dict lookup.
        """
        try:
            value: bool = _cache["USE_TZ"]
        except KeyError:
            value = _cache["USE_TZ"] = bool(django_settings.USE_TZ)
        return value

    @property
    def dead_letter_auto_retry(self) -> AutoRetry | None:
        """``DEBOUNCE_DEAD_LETTER_AUTO_RETRY``: the automatic retry sweep (§8, §11); None: off.

        Raises:
            ConfigurationError: the setting is malformed (see :func:`parse_auto_retry`).
        """
        return self._kept("DEAD_LETTER_AUTO_RETRY", parse_auto_retry)

    @property
    def codel(self) -> dict[str, CodelSettings]:
        """``DEBOUNCE_QUEUES``: queue name -> CoDel settings, for queues with CoDel on (§6).

        Parsed once, not on every claim (the dict is shared: do not change it).

        Raises:
            ConfigurationError: the setting is invalid (see :func:`parse_queues`).
        """
        return self._kept("QUEUES", parse_queues)

    @property
    def executor(self) -> str:
        """``DEBOUNCE_EXECUTOR``: ``"worker"`` (default) or ``"celery"``, for tasks that name none.

        Raises:
            ConfigurationError: another value (check E025).
        """
        return self._kept("EXECUTOR", parse_executor)

    @property
    def celery_queues(self) -> dict[str, str]:
        """``DEBOUNCE_CELERY_QUEUES``: debounce queue -> Celery queue (unlisted: same name).

        Raises:
            ConfigurationError: the setting is invalid (check E026).
        """
        return self._kept("CELERY_QUEUES", parse_celery_queues)

    @property
    def celery_handoff_lease(self) -> timedelta:
        """``DEBOUNCE_CELERY_HANDOFF_LEASE``: how long a job handed to Celery waits to be taken (5 min)."""
        return self._duration("CELERY_HANDOFF_LEASE")

    @property
    def celery_app(self) -> str | None:
        """``DEBOUNCE_CELERY_APP``: dotted path of the Celery app to publish with (None: current)."""
        value: str | None = self._get("CELERY_APP")
        return value


@dataclass(frozen=True)
class AutoRetry:
    """The parsed ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` setting (§8, §11).

    Attributes:
        every: how often a worker runs the sweep (at most once per ``every``,
            plus once at the start of every ``--burst``).
        min_age: an entry is retried once it is at least this old
            (``created_at <= now - min_age``).
        max_retries: how many automatic retries one job's chain of retries
            gets: an entry is retried while its ``retry_depth`` is below it.
    """

    every: timedelta
    min_age: timedelta
    max_retries: int


#: Values of the keys left out of ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` (the contract's example, §11).
AUTO_RETRY_DEFAULTS: dict[str, Any] = {"every": "10m", "min_age": "10m", "max_retries": 3}


def parse_auto_retry(value: Any) -> AutoRetry | None:
    """Parse ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY`` (§11).

    Args:
        value: ``None`` (the sweep is off), or a dict with any of the keys
            ``every`` and ``min_age`` (durations, §2) and ``max_retries``
            (int >= 1); a key left out takes its value from
            ``{"every": "10m", "min_age": "10m", "max_retries": 3}``.

    Returns:
        The parsed setting, or ``None`` when the sweep is off.

    Raises:
        ConfigurationError: not a dict, an unknown key, a duration that does
            not parse or is not positive, or ``max_retries`` not an int >= 1.
    """
    name = "DEBOUNCE_DEAD_LETTER_AUTO_RETRY"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{name}={value!r} must be None (off) or a dict such as "
            '{"every": "10m", "min_age": "10m", "max_retries": 3}.'
        )
    unknown = sorted(set(value) - set(AUTO_RETRY_DEFAULTS), key=str)
    if unknown:
        raise ConfigurationError(
            f"{name} has unknown key(s) {unknown}; the keys are every, min_age and max_retries."
        )
    merged = {**AUTO_RETRY_DEFAULTS, **value}
    retries = merged["max_retries"]
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ConfigurationError(
            f'{name}["max_retries"]={retries!r} must be an int >= 1 (automatic retries along '
            "one job's chain); set the whole setting to None to turn the sweep off."
        )
    return AutoRetry(
        every=parse_duration(merged["every"], name=f'{name}["every"]'),
        min_age=parse_duration(merged["min_age"], name=f'{name}["min_age"]'),
        max_retries=retries,
    )


settings = Settings()
