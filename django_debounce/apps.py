"""App configuration: label ``django_debounce`` (fixed forever)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .checks import register_checks
from .signals import job_enqueued
from .wakeup_checks import register_wakeup_checks
from .wakeup_redis import publish_after_commit

if TYPE_CHECKING:
    from .models import DeadLetter, Job


class DjangoDebounceConfig(AppConfig):
    """Registers the system checks, the Redis wake-up publisher, and imports every app's ``tasks``."""

    name = "django_debounce"
    label = "django_debounce"
    verbose_name = "Debounced jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_checks()
        register_wakeup_checks()
        # Publishes nothing unless the wake-up is "redis" (decision 82).
        job_enqueued.connect(publish_after_commit, dispatch_uid="django_debounce.wakeup_redis")
        autodiscover_modules("tasks")

    def retry_dead_letter(self, letter: DeadLetter, *, force: bool) -> Job | None:
        """Retry ``letter``: what :meth:`.DeadLetter.retry` delegates to (decision 69).

        The model sits below the enqueue path, so it reaches
        :func:`django_debounce.dead_letters.retry_dead_letter` through the app
        registry instead of importing it; this top-layer module imports it.
        """
        from .dead_letters import retry_dead_letter

        return retry_dead_letter(letter, force=force)
