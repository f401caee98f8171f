"""The dead-letters page (contract §8): shed entries told apart, a guarded Retry.

:class:`DeadLetterAdmin` lists dead letters newest first, filtered by kind,
error type and whether retried (filters in :mod:`.helpers`); its "Retry
selected" action goes through :meth:`django_debounce.models.DeadLetter.retry`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..exceptions import DebounceError
from ..models import DeadLetter
from .base import CallDisplayAdmin
from .helpers import (
    ErrorTypeFilter,
    KindFilter,
    QueueFilter,
    RetriedFilter,
    TaskNameFilter,
    exact_dead_letter_search,
    job_link,
    time_column,
    time_text,
)


@admin.register(DeadLetter)
class DeadLetterAdmin(CallDisplayAdmin):
    """Dead letters, newest first, with shed entries told apart and a guarded Retry (§8)."""

    list_display = [
        "id",
        "created_at_time",
        "kind_badge",
        "task",
        "queue",
        "short_reason",
        "original_job",
        "retried",
    ]
    list_filter = [
        KindFilter,
        TaskNameFilter,
        ErrorTypeFilter,
        QueueFilter,
        RetriedFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = ["=id", "=task_name", "=job__id"]
    search_help_text = _("Exact dead-letter id, task name or original job id.")
    ordering = ["-created_at", "-id"]
    actions = ["retry_selected"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Exact, index-served search (:func:`.helpers.exact_dead_letter_search`)."""
        return exact_dead_letter_search(queryset, search_term), False

    fieldsets = [
        (None, {"fields": ["id", "kind_badge", "task_name", "queue", "created_at_time", "reason"]}),
        (_("Call"), {"fields": ["arguments"]}),
        (_("Error"), {"fields": ["error", "traceback_pre", "metadata_pretty"]}),
        (
            _("Links"),
            {"fields": ["original_job", "retried_at_time", "retry_job_link", "retry_depth"]},
        ),
    ]

    created_at_time = time_column("created_at", _("created"))
    retried_at_time = time_column("retried_at", _("retried at"))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """Return whether the user holds ``django_debounce.retry_deadletter`` (superusers do)."""
        return bool(request.user.has_perm("django_debounce.retry_deadletter"))

    @admin.display(description=_("kind"))
    def kind_badge(self, letter: DeadLetter) -> SafeString:
        """Show the entry's ``kind`` as a coloured badge (its own name, so the column is this)."""
        return format_html(
            '<span class="debounce-kind debounce-kind-{}">{}</span>',
            letter.kind,
            letter.get_kind_display(),
        )

    @admin.display(description=_("reason"))
    def short_reason(self, letter: DeadLetter) -> str:
        return letter.reason if len(letter.reason) <= 80 else letter.reason[:79] + "…"

    @admin.display(description=_("original job"), ordering="job_id")
    def original_job(self, letter: DeadLetter) -> SafeString | str:
        return job_link(letter.job_id)

    @admin.display(description=_("retried"), ordering="retried_at")
    def retried(self, letter: DeadLetter) -> SafeString | str:
        if letter.retried_at is None:
            return "—"
        return format_html("{} → {}", time_text(letter.retried_at), job_link(letter.retry_job_id))

    @admin.display(description=_("retry job"))
    def retry_job_link(self, letter: DeadLetter) -> SafeString | str:
        return job_link(letter.retry_job_id)

    @admin.action(description=_("Retry selected dead letters"), permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Retry each selected entry once (:meth:`.DeadLetter.retry`); count retried and skipped.

        An entry already retried is skipped, also when two people click at
        once (``retry()`` locks the row). An entry whose call is no longer
        valid (the task's declaration changed) is reported as failed.
        """
        if not self.has_retry_permission(request):
            raise PermissionDenied
        ids = self._too_many(request, queryset)
        if ids is None:
            return
        retried: list[tuple[int, int]] = []
        skipped: list[int] = []
        failed: list[tuple[int, str]] = []
        for letter in DeadLetter.objects.filter(pk__in=ids).order_by("pk"):
            try:
                job = letter.retry()
            except (DebounceError, ValueError, TypeError, LookupError) as exc:
                failed.append((letter.pk, f"{type(exc).__name__}: {exc}"))
                continue
            if job is None:
                skipped.append(letter.pk)
            else:
                retried.append((letter.pk, job.pk))
        self.message_user(
            request,
            _("%(retried)s retried, %(skipped)s skipped (already retried)%(jobs)s.")
            % {
                "retried": ngettext("%d dead letter", "%d dead letters", len(retried))
                % len(retried),
                "skipped": len(skipped),
                "jobs": (
                    ": " + ", ".join(f"#{pk} → job #{job}" for pk, job in retried)
                    if retried
                    else ""
                ),
            },
            messages.SUCCESS if retried or not (skipped or failed) else messages.WARNING,
        )
        for pk, error in failed:
            self.message_user(
                request,
                _("Dead letter #%(pk)d could not be retried: %(error)s")
                % {"pk": pk, "error": error},
                messages.ERROR,
            )
