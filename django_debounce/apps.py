"""App configuration: label ``django_debounce`` (fixed forever)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .checks import register_checks

if TYPE_CHECKING:
    from .models import DeadLetter, Job


class DjangoDebounceConfig(AppConfig):
    """Registers the system checks, imports every installed app's ``tasks`` module and the
    Celery executor's Celery tasks when Celery is installed."""

    name = "django_debounce"
    label = "django_debounce"
    verbose_name = "Debounced jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_checks()
        autodiscover_modules("tasks")
        if importlib.util.find_spec("celery") is not None:
            # The Celery executor's tasks (issue #10): registered with every Celery app of the
            # process, so `celery -A proj worker` runs handed-off jobs without more setup.
            from . import celery_tasks  # noqa: F401

    def retry_dead_letter(self, letter: DeadLetter, *, force: bool) -> Job | None:
        """Retry ``letter``: what :meth:`.DeadLetter.retry` delegates to (decision 69).

        The model sits below the enqueue path, so it reaches
        :func:`django_debounce.dead_letters.retry_dead_letter` through the app
        registry instead of importing it; this top-layer module imports it.
        """
        from .dead_letters import retry_dead_letter

        return retry_dead_letter(letter, force=force)
