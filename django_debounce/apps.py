"""App configuration: label ``django_debounce`` (fixed forever)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DjangoDebounceConfig(AppConfig):
    """Registers the system checks and imports every installed app's ``tasks`` module."""

    name = "django_debounce"
    label = "django_debounce"
    verbose_name = "Debounced jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)

        autodiscover_modules("tasks")
