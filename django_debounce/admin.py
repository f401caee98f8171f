"""Read-only admin for jobs and dead letters (the full admin comes later, contract §9)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import DeadLetter, Job


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete: rows change only through the package's transitions."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs, newest first."""

    list_display = [
        "id",
        "task_name",
        "queue",
        "status",
        "priority",
        "run_at",
        "enqueue_count",
        "attempts",
    ]
    list_filter = ["status", "queue"]
    search_fields = ["=id", "task_name", "debounce_key"]
    date_hierarchy = None


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Dead letters, newest first."""

    list_display = ["id", "task_name", "queue", "reason", "created_at", "retried_at"]
    list_filter = ["queue"]
    search_fields = ["=id", "task_name", "reason"]
    raw_id_fields = ["job", "retry_job"]
