from __future__ import annotations

from django.apps import AppConfig


class DocsConfig(AppConfig):
    name = "example_project.docs"
    label = "docs"
    verbose_name = "Docs builds (example)"
    default_auto_field = "django.db.models.BigAutoField"
