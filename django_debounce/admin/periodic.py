"""The periodic ticks page: each tick a scheduler deferred or skipped, newest first (decision 177).

View-only, like every page. The schedules this process registered head the
changelist with their next tick; the schedule filter takes its choices from
the registry (no ``SELECT DISTINCT`` over the table), and a filtered page is
an index range of the unique (``schedule``, ``tick``) constraint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import PeriodicTick
from ..ops.periodic import registered_schedules, schedule_rows
from .base import ReadOnlyAdmin
from .helpers import time_column, time_text


class ScheduleFilter(admin.SimpleListFilter):
    """Filter by schedule name; choices are the registered schedules."""

    title = _("schedule")
    parameter_name = "schedule"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(p.name, p.name) for p in registered_schedules()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(schedule=value) if value else queryset


@admin.register(PeriodicTick)
class PeriodicTickAdmin(ReadOnlyAdmin):
    """Deferred ticks of periodic tasks, with the job each enqueued, view-only."""

    list_display = ["schedule", "tick_time", "outcome", "job_link", "late", "deferred_by"]
    list_display_links = ["schedule"]
    list_filter = [ScheduleFilter, "outcome"]
    ordering = ["-tick", "-id"]
    fields = ("schedule", "task_name", "tick", "outcome", "job_link", "deferred_at", "deferred_by")
    readonly_fields = fields

    tick_time = time_column("tick", _("tick"))

    @admin.display(description=_("job"))
    def job_link(self, row: PeriodicTick) -> SafeString | str:
        if row.job_id is None:
            return "-"
        url = reverse("admin:django_debounce_job_change", args=[row.job_id])
        return format_html('<a href="{}">#{}</a>', url, row.job_id)

    @admin.display(description=_("late by"))
    def late(self, row: PeriodicTick) -> str:
        return f"{(row.deferred_at - row.tick).total_seconds():.1f} s"

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The changelist, with this process's schedules (next and last tick) in its context.

        Each row as :func:`~django_debounce.ops.periodic.schedule_rows` gives it (ISO
        instants), plus ``next_tick_text``/``last_tick_text``: the instants as the ticks'
        column shows them (the current time zone, to the second).
        """
        rows = [
            {
                **row,
                **{
                    f"{key}_text": time_text(datetime.fromisoformat(row[key])) if row[key] else "-"
                    for key in ("next_tick", "last_tick")
                },
            }
            for row in schedule_rows()
        ]
        extra = {"debounce_schedules": rows, **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)
