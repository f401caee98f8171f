"""The admin: open windows, jobs and dead letters (contract §8, §9).

Every page is read-only: rows change only through the package's transitions,
here the actions "Run now" and "Cancel" (open windows, :mod:`.windows`) and
"Retry selected" (dead letters, :meth:`.DeadLetter.retry`). There is no add,
change or delete anywhere.

Changelists stay cheap on large tables (issue #4, 1M jobs): a page load runs a
fixed number of queries whatever the page size; the count is capped
(:class:`~.admin_helpers.CappedCountPaginator`, no unbounded ``COUNT(*)``),
facets are off, and the task and queue filters take their choices from the
task registry and ``DEBOUNCE_QUEUES`` instead of a ``SELECT DISTINCT`` over
the table. Paginator, filters and display helpers live in :mod:`.admin_helpers`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import windows
from .admin_helpers import (
    KINDS,
    CappedCountPaginator,
    ErrorTypeFilter,
    KindFilter,
    QueueFilter,
    RetriedFilter,
    TaskFilter,
    countdown_html,
    job_link,
    kind_of,
    payload_preview,
    pretty_json,
    time_column,
    time_text,
)
from .exceptions import DebounceError
from .models import DeadLetter, Job, OpenWindow

#: An action handles at most this many selected rows per click.
MAX_ACTION_ROWS = 1_000

#: Why a job became due when it did (``Job.run_reason``), in operators' words.
RUN_REASONS = {
    "quiet": _("the window went quiet: no call for one window length after the last call"),
    "max_wait": _("max wait reached: calls kept coming until the ceiling (opened + max wait)"),
    "not_debounced": _("not debounced: it was due at its run_at"),
    "retry": _("a retry: an earlier attempt failed or its worker stopped; see attempts and error"),
}


# -- base ----------------------------------------------------------------------------


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete: rows change only through the package's transitions.

    Bounded changelists: capped count, no full result count, no facets.
    """

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedCountPaginator
    list_per_page = 50

    class Media:
        css = {"all": ["django_debounce/admin.css"]}

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _too_many(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[int] | None:
        """Return the selected primary keys, or None (with an error message) over the limit."""
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: MAX_ACTION_ROWS + 1])
        if len(ids) > MAX_ACTION_ROWS:
            self.message_user(
                request,
                _("Select at most %(limit)d rows per action; nothing was done.")
                % {"limit": MAX_ACTION_ROWS},
                messages.ERROR,
            )
            return None
        return ids


# -- jobs and open windows -----------------------------------------------------------


class WindowActionsAdmin(ReadOnlyAdmin):
    """The "Run now" and "Cancel" actions, guarded by ``django_debounce.change_job``."""

    def has_windows_permission(self, request: HttpRequest) -> bool:
        """Return whether the user may run or cancel open windows (``change_job``)."""
        return bool(request.user.has_perm("django_debounce.change_job"))

    def _report(
        self, request: HttpRequest, done_text: str, result: windows.WindowActionResult
    ) -> None:
        if result.done:
            self.message_user(request, done_text, messages.SUCCESS)
        if result.refused:
            self.message_user(
                request,
                ngettext(
                    "%(count)d job refused: it is no longer an open window (a worker claimed it "
                    "meanwhile, or it finished): %(ids)s.",
                    "%(count)d jobs refused: they are no longer open windows (a worker claimed "
                    "them meanwhile, or they finished): %(ids)s.",
                    len(result.refused),
                )
                % {
                    "count": len(result.refused),
                    "ids": ", ".join(f"#{pk}" for pk in result.refused),
                },
                messages.WARNING,
            )

    def _selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[int] | None:
        """Return the ids the operator ticked, also those no longer in the changelist's queryset.

        The open-windows queryset drops a job the moment a worker claims it; reading
        the ticked ids from the form lets the action report it as refused instead of
        silently skipping it. "Select all" uses the queryset.
        """
        if request.POST.get("select_across") == "1":
            return self._too_many(request, queryset)
        ticked = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ids = sorted({int(value) for value in ticked if value.isdigit()})
        if not ids:  # called outside the changelist form
            return self._too_many(request, queryset)
        if len(ids) > MAX_ACTION_ROWS:
            return self._too_many(request, Job.objects.filter(pk__in=ids))
        return ids

    @admin.action(description=_("Run now (deadline = now)"), permissions=["windows"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Make the selected open windows due now (:func:`.windows.run_now`)."""
        if not self.has_windows_permission(request):
            raise PermissionDenied
        ids = self._selected(request, queryset)
        if ids is None:
            return
        result = windows.run_now(ids)
        count = len(result.done)
        self._report(
            request,
            ngettext(
                "%(count)d open window made due now.",
                "%(count)d open windows made due now.",
                count,
            )
            % {"count": count},
            result,
        )

    @admin.action(description=_("Cancel (never run)"), permissions=["windows"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Cancel the selected open windows and their dependents (:func:`.windows.cancel`)."""
        if not self.has_windows_permission(request):
            raise PermissionDenied
        ids = self._selected(request, queryset)
        if ids is None:
            return
        result = windows.cancel(ids)
        count = len(result.done)
        text = ngettext(
            "%(count)d open window cancelled.", "%(count)d open windows cancelled.", count
        ) % {"count": count}
        if result.cancelled_dependents:
            text += " " + ngettext(
                "%(count)d dependent job cancelled with it.",
                "%(count)d dependent jobs cancelled with them.",
                len(result.cancelled_dependents),
            ) % {"count": len(result.cancelled_dependents)}
        self._report(request, text, result)


@admin.register(Job)
class JobAdmin(WindowActionsAdmin):
    """All jobs, newest first; the detail explains why the job ran when it did."""

    list_display = [
        "id",
        "task_name",
        "queue",
        "status",
        "key",
        "priority",
        "run_at_time",
        "enqueue_count",
        "attempts",
        "created_at_time",
    ]
    list_filter = ["status", QueueFilter, TaskFilter, ("created_at", admin.DateFieldListFilter)]
    search_fields = ["=id", "=debounce_key", "=task_name"]
    search_help_text = _("Exact job id, debounce key or task name.")
    actions = ["run_now", "cancel"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "task_name",
                    "queue",
                    "priority",
                    "status",
                    "why_it_ran",
                    "window",
                    "debounce_key",
                    "unique_key",
                    "calls",
                ]
            },
        ),
        (_("Call"), {"fields": ["arguments", "metadata_pretty", "notes"]}),
        (
            _("Outcome"),
            {"fields": ["attempts", "max_retries", "result_pretty", "error", "traceback_pre"]},
        ),
        (
            _("Timestamps"),
            {
                "fields": [
                    "created_at_time",
                    "opened_at_time",
                    "last_call",
                    "run_at_time",
                    "ceiling",
                    "expires_at_time",
                    "started_at_time",
                    "finished_at_time",
                ]
            },
        ),
        (_("Worker"), {"fields": ["worker_id", "lease_expires_at_time"]}),
        (_("Related"), {"fields": ["dead_letter_links", "dependency_links", "dependent_links"]}),
    ]

    created_at_time = time_column("created_at", _("created"))
    opened_at_time = time_column("opened_at", _("window opened"))
    last_call = time_column("last_enqueued_at", _("last call"))
    run_at_time = time_column("run_at", _("run at (deadline)"))
    ceiling = time_column("max_run_at", _("ceiling (opened + max wait)"))
    expires_at_time = time_column("expires_at", _("expires"))
    started_at_time = time_column("started_at", _("started"))
    finished_at_time = time_column("finished_at", _("finished"))
    lease_expires_at_time = time_column("lease_expires_at", _("lease expires"))

    @admin.display(description=_("calls collapsed"), ordering="enqueue_count")
    def calls(self, job: Job) -> int:
        return job.enqueue_count

    @admin.display(description=_("key"))
    def key(self, job: Job) -> str:
        key = job.debounce_key or job.unique_key or ""
        return key if len(key) <= 40 else key[:39] + "…"

    @admin.display(description=_("why it ran when it did"))
    def why_it_ran(self, job: Job) -> str:
        reason = str(RUN_REASONS[job.run_reason])
        if job.is_open_window:
            return _("window still open; if no call comes, it will run because %(r)s") % {
                "r": reason
            }
        return reason

    @admin.display(description=_("window"))
    def window(self, job: Job) -> SafeString | str:
        if not job.is_open_window:
            return str(_("closed")) if job.opened_at else "—"
        return format_html(
            "{} · {} {}",
            countdown_html(job.run_at),
            _("ceiling"),
            time_text(job.max_run_at),
        )

    @admin.display(description=_("arguments"))
    def arguments(self, job: Job) -> SafeString:
        return pretty_json({"args": job.args, "kwargs": job.kwargs})

    @admin.display(description=_("metadata"))
    def metadata_pretty(self, job: Job) -> SafeString:
        return pretty_json(job.metadata)

    @admin.display(description=_("result"))
    def result_pretty(self, job: Job) -> SafeString:
        return pretty_json(job.result)

    @admin.display(description=_("traceback"))
    def traceback_pre(self, job: Job) -> SafeString | str:
        if not job.traceback:
            return "—"
        return format_html('<pre class="debounce-pre">{}</pre>', job.traceback)

    @admin.display(description=_("dead letters"))
    def dead_letter_links(self, job: Job) -> SafeString | str:
        letters = list(DeadLetter.objects.filter(job=job).values_list("pk", "reason")[:20]) + [
            (pk, _("retried as this job")) for pk in _retried_into(job)
        ]
        if not letters:
            return "—"
        return format_html_join(
            "",
            '<div><a href="{}">#{}</a> {}</div>',
            (
                (reverse("admin:django_debounce_deadletter_change", args=[pk]), pk, reason)
                for pk, reason in letters
            ),
        )

    @admin.display(description=_("depends on"))
    def dependency_links(self, job: Job) -> SafeString | str:
        return _job_list(job.depends_on.order_by("pk").values_list("pk", "task_name", "status"))

    @admin.display(description=_("dependents"))
    def dependent_links(self, job: Job) -> SafeString | str:
        return _job_list(job.dependents.order_by("pk").values_list("pk", "task_name", "status"))


def _retried_into(job: Job) -> list[int]:
    return list(DeadLetter.objects.filter(retry_job=job).values_list("pk", flat=True)[:20])


def _job_list(rows: Any, limit: int = 50) -> SafeString | str:
    rows = list(rows[:limit])
    if not rows:
        return "—"
    return format_html_join(
        "",
        '<div><a href="{}">#{}</a> {} ({})</div>',
        (
            (reverse("admin:django_debounce_job_change", args=[pk]), pk, name, status)
            for pk, name, status in rows
        ),
    )


@admin.register(OpenWindow)
class OpenWindowAdmin(JobAdmin):
    """Open debounce windows (§4.1), soonest deadline first, with a live countdown."""

    list_display = [
        "job",
        "task_name",
        "debounce_key",
        "opened_at_time",
        "deadline",
        "ceiling",
        "calls",
        "last_call",
        "payload",
        "queue",
    ]
    list_display_links = None
    list_filter = [TaskFilter, QueueFilter]
    search_fields = ["debounce_key"]
    search_help_text = _("Part of the debounce key.")
    ordering = ["run_at", "id"]

    class Media:
        js = ["django_debounce/countdown.js"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return OpenWindow.objects.open_windows()

    @admin.display(description=_("job"), ordering="id")
    def job(self, window: Job) -> SafeString | str:
        return job_link(window.pk)

    @admin.display(description=_("deadline"), ordering="run_at")
    def deadline(self, window: Job) -> SafeString:
        return format_html(
            '{}<br><span class="debounce-quiet">{}</span>',
            countdown_html(window.run_at),
            time_text(window.run_at),
        )

    opened_at_time = time_column("opened_at", _("opened"))
    ceiling = time_column("max_run_at", _("ceiling"))

    @admin.display(description=_("payload"))
    def payload(self, window: Job) -> SafeString:
        return format_html("<code>{}</code>", payload_preview(window.args, window.kwargs))


# -- dead letters --------------------------------------------------------------------


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Dead letters, newest first, with shed entries told apart and a guarded Retry (§8)."""

    list_display = [
        "id",
        "created_at_time",
        "kind",
        "task_name",
        "queue",
        "short_reason",
        "original_job",
        "retried",
    ]
    list_filter = [
        KindFilter,
        TaskFilter,
        ErrorTypeFilter,
        QueueFilter,
        RetriedFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = ["=id", "=task_name", "=job__id"]
    search_help_text = _("Exact dead-letter id, task name or original job id.")
    ordering = ["-created_at", "-id"]
    actions = ["retry_selected"]
    fieldsets = [
        (None, {"fields": ["id", "kind", "task_name", "queue", "created_at_time", "reason"]}),
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
    def kind(self, letter: DeadLetter) -> SafeString:
        value = kind_of(letter.reason)
        labels = {v: label for v, label, _prefix in KINDS}
        return format_html(
            '<span class="debounce-kind debounce-kind-{}">{}</span>',
            value,
            labels.get(value, _("other")),
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

    @admin.display(description=_("arguments"))
    def arguments(self, letter: DeadLetter) -> SafeString:
        return pretty_json({"args": letter.args, "kwargs": letter.kwargs})

    @admin.display(description=_("metadata"))
    def metadata_pretty(self, letter: DeadLetter) -> SafeString:
        return pretty_json(letter.metadata)

    @admin.display(description=_("traceback"))
    def traceback_pre(self, letter: DeadLetter) -> SafeString | str:
        if not letter.traceback:
            return "—"
        return format_html('<pre class="debounce-pre">{}</pre>', letter.traceback)

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
