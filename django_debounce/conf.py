"""The one reader of ``django.conf.settings`` for ``DEBOUNCE_*`` names.

Every setting is read lazily on attribute access, so ``override_settings``
works in tests. Validation lives in :mod:`django_debounce.checks`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

from .durations import DurationLike, parse_duration

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
}


class Settings:
    """Lazy, typed view of the ``DEBOUNCE_*`` settings."""

    def _get(self, name: str) -> Any:
        return getattr(django_settings, f"DEBOUNCE_{name}", DEFAULTS[name])

    def _duration(self, name: str) -> timedelta:
        value: DurationLike = self._get(name)
        return parse_duration(value, name=f"DEBOUNCE_{name}")

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
        return int(self._get("MAX_RETRIES"))

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
        return bool(self._get("BACKOFF_JITTER"))

    @property
    def poll_interval(self) -> float:
        """``DEBOUNCE_POLL_INTERVAL``: seconds between polls of an idle worker (default 1.0)."""
        return float(self._get("POLL_INTERVAL"))

    @property
    def shutdown_grace(self) -> timedelta:
        """``DEBOUNCE_SHUTDOWN_GRACE``: how long SIGTERM waits for running jobs (default 30 s)."""
        return self._duration("SHUTDOWN_GRACE")

    @property
    def enqueue_retries(self) -> int:
        """``DEBOUNCE_ENQUEUE_RETRIES``: attempts before ``EnqueueContentionError`` (default 20)."""
        return int(self._get("ENQUEUE_RETRIES"))


settings = Settings()
