"""App configuration: label ``django_debounce`` (fixed forever)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .checks import register_checks
from .conf import settings
from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from .models import DeadLetter, Job


class DjangoDebounceConfig(AppConfig):
    """Registers the system checks, imports every installed app's ``tasks`` module, connects metrics."""

    name = "django_debounce"
    label = "django_debounce"
    verbose_name = "Debounced jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_checks()
        autodiscover_modules("tasks")
        if _metrics_wanted():
            from .metrics import install

            install()

    def retry_dead_letter(self, letter: DeadLetter, *, force: bool) -> Job | None:
        """Retry ``letter``: what :meth:`.DeadLetter.retry` delegates to (decision 69).

        The model sits below the enqueue path, so it reaches
        :func:`django_debounce.dead_letters.retry_dead_letter` through the app
        registry instead of importing it; this top-layer module imports it.
        """
        from .dead_letters import retry_dead_letter

        return retry_dead_letter(letter, force=force)


def _metrics_wanted() -> bool:
    """True when prometheus_client imports and ``DEBOUNCE_METRICS`` is not False.

    A malformed metrics setting turns metrics off here; ``manage.py check``
    reports it (E040, E041), and so does the worker's ``--metrics-port``.
    """
    try:
        enabled = settings.metrics
        settings.metrics_delay_buckets, settings.metrics_duration_buckets  # noqa: B018
    except ConfigurationError:
        return False
    return enabled is not False and importlib.util.find_spec("prometheus_client") is not None
