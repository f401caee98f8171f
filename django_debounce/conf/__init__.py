"""The one reader of ``django.conf.settings`` for ``DEBOUNCE_*`` names.

Every setting is read and parsed at its first attribute access and kept
(``settings.codel`` is read on every claim, ``settings.use_tz`` on every
enqueue); Django's ``setting_changed`` signal naming a ``DEBOUNCE_*`` setting
or ``USE_TZ`` forgets what was kept (``override_settings`` sends it), so tests
that change settings see the new values. Validation lives in
:mod:`django_debounce.checks.settings`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from ..exceptions import ConfigurationError
from .auto_retry import AUTO_RETRY_DEFAULTS, AutoRetry, parse_auto_retry
from .durations import DurationLike, parse_duration
from .executor import parse_celery_queues, parse_executor, parse_unknown_task_grace
from .metrics import parse_buckets, parse_metrics_enabled
from .numbers import (
    parse_enqueue_retries,
    parse_flush_interval,
    parse_max_retries,
    parse_poll_interval,
    parse_prefetch,
)
from .queues import CODEL_KEYS, QUEUE_KEYS, CodelSettings, parse_queues
from .redis import parse_redis_alias
from .retention import Prune, parse_prune
from .wakeup import parse_wakeup

__all__ = [
    "AUTO_RETRY_DEFAULTS",
    "CODEL_KEYS",
    "DEFAULTS",
    "MIN_PAYLOAD_BYTES",
    "QUEUE_KEYS",
    "AutoRetry",
    "CodelSettings",
    "Prune",
    "Settings",
    "parse_auto_retry",
    "parse_buckets",
    "parse_max_payload_bytes",
    "parse_metrics_enabled",
    "parse_prune",
    "parse_queues",
    "settings",
]

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
    # Jobs a busy worker claims beyond its free threads (issue #12; decision 121).
    "PREFETCH": 100,
    # Longest a success waits for its batched write, in seconds; 0: write each at once.
    "SUCCESS_FLUSH_INTERVAL": 0.1,
    # How many times an enqueue retries a lost race or a lock wait (§4.4).
    "ENQUEUE_RETRIES": 20,
    # Per-queue options, e.g. {"default": {"codel": {...}}} (§11).
    "QUEUES": {},
    "DEAD_LETTER_AUTO_RETRY": None,
    # Largest JSON text of one job's args + kwargs (and of its metadata, and of a
    # result), in bytes (docs/reference/settings.md; decision 29 in docs/decisions.md).
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Prometheus metrics (docs/howto/metrics.md): None = on when prometheus_client imports.
    "METRICS": None,
    # Histogram buckets, seconds: window opened -> run started, and one attempt's run.
    "METRICS_DELAY_BUCKETS": (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600),
    "METRICS_DURATION_BUCKETS": (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    # The worker's automatic prune of finished jobs (issue #11; retention_settings.py). None: off.
    "PRUNE": None,
    # How an idle worker learns of new work (wakeup_settings.py): auto, notify, redis, poll.
    "WAKEUP": "auto",
    # django-redis cache alias: rate-limit buckets (redis_settings.py) and the Redis wake-up.
    "REDIS": None,
    # Who runs jobs: "worker" (run_debounce_worker) or "celery" (docs/howto/celery.md).
    "EXECUTOR": "worker",
    # The Celery executor: debounce queue -> Celery queue, and the hand-off's lease.
    "CELERY_QUEUES": {},
    "CELERY_HANDOFF_LEASE": "5m",
    # Dotted path of the Celery app to publish with; None: Celery's current app.
    "CELERY_APP": None,
    # How long a job naming a task this process does not know is put back, not dead-lettered
    # (a rolling deploy; unknown_tasks.py, decision 154). 0: dead-letter at once.
    "UNKNOWN_TASK_GRACE": "10m",
}


#: The smallest ``DEBOUNCE_MAX_PAYLOAD_BYTES`` accepted (check E014): 1 KiB.
MIN_PAYLOAD_BYTES = 1024


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
        """``DEBOUNCE_MAX_RETRIES``: default retries after the first attempt (default 3).

        Raises:
            ConfigurationError: not an int from 0 to 10,000 (check E009; decision 163).
        """
        return self._kept("MAX_RETRIES", parse_max_retries)

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
        """``DEBOUNCE_POLL_INTERVAL``: seconds between polls of an idle worker (default 1.0).

        Raises:
            ConfigurationError: not a finite number over 0 and at most a day (check E010).
        """
        return self._kept("POLL_INTERVAL", parse_poll_interval)

    @property
    def prefetch(self) -> int:
        """``DEBOUNCE_PREFETCH``: jobs a busy worker claims beyond its free threads (default 100)."""
        return self._kept("PREFETCH", parse_prefetch)

    @property
    def success_flush_interval(self) -> float:
        """``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``: longest wait of a success for its batched write (default 0.1 s)."""
        return self._kept("SUCCESS_FLUSH_INTERVAL", parse_flush_interval)

    @property
    def shutdown_grace(self) -> timedelta:
        """``DEBOUNCE_SHUTDOWN_GRACE``: how long SIGTERM waits for running jobs (default 30 s)."""
        return self._duration("SHUTDOWN_GRACE")

    @property
    def enqueue_retries(self) -> int:
        """``DEBOUNCE_ENQUEUE_RETRIES``: attempts before ``EnqueueContentionError`` (default 20)."""
        return self._kept("ENQUEUE_RETRIES", parse_enqueue_retries)

    @property
    def max_payload_bytes(self) -> int:
        """``DEBOUNCE_MAX_PAYLOAD_BYTES``: largest JSON text of a job's payload (default 1 MiB).

        Raises:
            ConfigurationError: the setting is invalid (see :func:`parse_max_payload_bytes`).
        """
        return self._kept("MAX_PAYLOAD_BYTES", parse_max_payload_bytes)

    @property
    def wakeup(self) -> str:
        """``DEBOUNCE_WAKEUP`` (:func:`~django_debounce.conf.wakeup.parse_wakeup`; E020)."""
        return self._kept("WAKEUP", parse_wakeup)

    @property
    def redis(self) -> str | None:
        """``DEBOUNCE_REDIS``: the django-redis alias of the rate-limit buckets; None: off (E035)."""
        return self._kept("REDIS", parse_redis_alias)

    @property
    def metrics(self) -> bool | None:
        """``DEBOUNCE_METRICS``: None (on when prometheus_client imports), True or False."""
        return self._kept("METRICS", parse_metrics_enabled)

    @property
    def metrics_delay_buckets(self) -> tuple[float, ...]:
        """``DEBOUNCE_METRICS_DELAY_BUCKETS``: bounds of the debounce delay histogram, seconds."""
        name = "DEBOUNCE_METRICS_DELAY_BUCKETS"
        return self._kept("METRICS_DELAY_BUCKETS", lambda value: parse_buckets(value, name=name))

    @property
    def metrics_duration_buckets(self) -> tuple[float, ...]:
        """``DEBOUNCE_METRICS_DURATION_BUCKETS``: bounds of the attempt duration histogram."""
        name = "DEBOUNCE_METRICS_DURATION_BUCKETS"
        return self._kept("METRICS_DURATION_BUCKETS", lambda value: parse_buckets(value, name=name))

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
    def prune(self) -> Prune | None:
        """``DEBOUNCE_PRUNE``: the worker's automatic prune of finished jobs; None: off.

        Raises:
            ConfigurationError: the setting is malformed (see
                :func:`~django_debounce.conf.retention.parse_prune`).
        """
        return self._kept("PRUNE", parse_prune)

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
    def unknown_task_grace(self) -> timedelta:
        """``DEBOUNCE_UNKNOWN_TASK_GRACE``: how long after its last enqueue an unknown task's job is put back (10 min).

        Raises:
            ConfigurationError: not a duration (check E044).
        """
        return self._kept("UNKNOWN_TASK_GRACE", parse_unknown_task_grace)

    @property
    def celery_app(self) -> str | None:
        """``DEBOUNCE_CELERY_APP``: dotted path of the Celery app to publish with (None: current)."""
        value: str | None = self._get("CELERY_APP")
        return value


settings = Settings()
