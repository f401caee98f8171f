from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from .models import DocBuild


@admin.register(DocBuild)
class DocBuildAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["directory", "ran_at", "calls", "opened_at", "run_reason", "job"]
    list_filter = ["run_reason"]
    search_fields = ["directory"]
    date_hierarchy = "ran_at"
    raw_id_fields = ["job"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DocBuild | None = None) -> bool:
        return False
