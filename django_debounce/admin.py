"""The admin: open windows, jobs, dead letters and flow-control state (contract §6, §8, §9).

Every page is read-only: rows change only through the package's transitions,
here the actions "Run now" and "Cancel" (READY jobs, :mod:`.windows`) and
"Retry selected" (dead letters, :meth:`.DeadLetter.retry`). There is no add,
change or delete anywhere. A READY job's page says what holds it back
(:mod:`.hold_reasons`); the task and queue state pages show breakers, token
buckets, caps and CoDel as of now.

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
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import hold_reasons, windows
from .admin_helpers import (
    CappedCountPaginator,
    ErrorTypeFilter,
    KindFilter,
    QueueFilter,
    RetriedFilter,
    TaskFilter,
    countdown_html,
    exact_dead_letter_search,
    exact_job_search,
    job_link,
    payload_preview,
    pretty_json,
    task_name_column,
    time_column,
    time_text,
)
from .claim_rules import live_lease
from .exceptions import DebounceError
from .models import DeadLetter, Job, OpenWindow, QueueState, TaskState

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


class CallDisplayAdmin(ReadOnlyAdmin):
    """Read-only displays of a stored call, shared by jobs and dead letters.

    Both models carry ``args``, ``kwargs``, ``metadata`` and ``traceback``.
    """

    task = task_name_column()

    @admin.display(description=_("arguments"))
    def arguments(self, row: Job | DeadLetter) -> SafeString:
        return pretty_json({"args": row.args, "kwargs": row.kwargs})

    @admin.display(description=_("metadata"))
    def metadata_pretty(self, row: Job | DeadLetter) -> SafeString:
        return pretty_json(row.metadata)

    @admin.display(description=_("traceback"))
    def traceback_pre(self, row: Job | DeadLetter) -> SafeString | str:
        if not row.traceback:
            return "—"
        return format_html('<pre class="debounce-pre">{}</pre>', row.traceback)


# -- jobs and open windows -----------------------------------------------------------


class WindowActionsAdmin(CallDisplayAdmin):
    """The "Run now" and "Cancel" actions, guarded by ``django_debounce.change_job``.

    They act on READY jobs (:mod:`.windows`); with :attr:`only_open_windows`
    (the open-windows page) only on jobs that are still open windows.
    """

    #: Act only on open windows (the open-windows page), not on every READY job.
    only_open_windows = False

    def has_windows_permission(self, request: HttpRequest) -> bool:
        """Return whether the user may run or cancel waiting jobs (``change_job``)."""
        return bool(request.user.has_perm("django_debounce.change_job"))

    def _report(
        self, request: HttpRequest, done_text: str, result: windows.WindowActionResult
    ) -> None:
        """Report what was done, then each kind of refusal, naming the jobs."""
        if result.done:
            self.message_user(request, done_text, messages.SUCCESS)
        refusals = [
            (
                result.running,
                ngettext(
                    "%(count)d job refused: a worker claimed it meanwhile (it is running): "
                    "%(ids)s.",
                    "%(count)d jobs refused: a worker claimed them meanwhile (they are running): "
                    "%(ids)s.",
                    len(result.running),
                ),
            ),
            (
                sorted(result.finished),
                ngettext(
                    "%(count)d job refused: it already finished: %(ids)s.",
                    "%(count)d jobs refused: they already finished: %(ids)s.",
                    len(result.finished),
                ),
            ),
            (
                result.not_window,
                ngettext(
                    "%(count)d job refused: it is no longer an open window (a worker claimed it "
                    "meanwhile and it now waits for a retry; act on it from the Jobs page): "
                    "%(ids)s.",
                    "%(count)d jobs refused: they are no longer open windows (a worker claimed "
                    "them meanwhile and they now wait for a retry; act on them from the Jobs "
                    "page): %(ids)s.",
                    len(result.not_window),
                ),
            ),
            (
                result.missing,
                ngettext(
                    "%(count)d job refused: no such job: %(ids)s.",
                    "%(count)d jobs refused: no such jobs: %(ids)s.",
                    len(result.missing),
                ),
            ),
        ]
        for ids, text in refusals:
            if not ids:
                continue
            names = ", ".join(
                f"#{pk} ({result.finished[pk].lower()})" if pk in result.finished else f"#{pk}"
                for pk in ids
            )
            self.message_user(request, text % {"count": len(ids), "ids": names}, messages.WARNING)

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

    def _flow_control_note(self, request: HttpRequest, job_ids: list[int]) -> None:
        """Say which of the jobs made due still pass flow control at claim (§6)."""
        by_task: dict[str, list[int]] = {}
        for pk, name in (
            Job.objects.filter(pk__in=job_ids).order_by("pk").values_list("pk", "task_name")
        ):
            by_task.setdefault(name, []).append(pk)
        notes = hold_reasons.flow_control_notes(list(by_task))
        for name, note in notes.items():
            ids = by_task[name]
            shown = ", ".join(f"#{pk}" for pk in ids[:20]) + (" …" if len(ids) > 20 else "")
            self.message_user(
                request,
                _(
                    "Run now does not bypass flow control: task %(task)s %(note)s. "
                    "Waiting there: %(ids)s."
                )
                % {"task": name, "note": note, "ids": shown},
                messages.WARNING,
            )

    @admin.action(description=_("Run now (deadline = now)"), permissions=["windows"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Make the selected READY jobs due now (:func:`.windows.run_now`)."""
        if not self.has_windows_permission(request):
            raise PermissionDenied
        ids = self._selected(request, queryset)
        if ids is None:
            return
        result = windows.run_now(ids, only_open_windows=self.only_open_windows)
        count = len(result.done)
        if self.only_open_windows:
            text = ngettext(
                "%(count)d open window made due now.", "%(count)d open windows made due now.", count
            )
        else:
            text = ngettext("%(count)d job made due now.", "%(count)d jobs made due now.", count)
        self._report(request, text % {"count": count}, result)
        if result.done:
            self._flow_control_note(request, result.done)

    @admin.action(description=_("Cancel (never run)"), permissions=["windows"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Cancel the selected READY jobs and their dependents (:func:`.windows.cancel`)."""
        if not self.has_windows_permission(request):
            raise PermissionDenied
        ids = self._selected(request, queryset)
        if ids is None:
            return
        result = windows.cancel(ids, only_open_windows=self.only_open_windows)
        count = len(result.done)
        if self.only_open_windows:
            text = ngettext(
                "%(count)d open window cancelled.", "%(count)d open windows cancelled.", count
            )
        else:
            text = ngettext("%(count)d job cancelled.", "%(count)d jobs cancelled.", count)
        text %= {"count": count}
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
        "task",
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

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Exact, index-served search (:func:`.admin_helpers.exact_job_search`; issue #4)."""
        return exact_job_search(queryset, search_term), False

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
                    "held_back_by",
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
        if job.is_open_window:
            return _("window still open; if no call comes, it will run because %(r)s") % {
                "r": RUN_REASONS[job.run_reason]
            }
        if job.status == Job.Status.READY:
            if job.attempts == 0:
                return _("has not run yet (due %(due)s)") % {"due": time_text(job.run_at)}
            return _(
                "waiting for a retry (attempt %(next)d due %(due)s): an earlier attempt failed "
                "or its worker stopped; see error"
            ) % {"next": job.attempts + 1, "due": time_text(job.run_at)}
        if job.status in (Job.Status.SHED, Job.Status.EXPIRED, Job.Status.CANCELLED):
            why = _never_ran_because(job)
            if job.attempts == 0:
                return _("never ran: %(why)s") % {"why": why}
            return ngettext(
                "did not run again after %(n)d attempt: %(why)s",
                "did not run again after %(n)d attempts: %(why)s",
                job.attempts,
            ) % {"n": job.attempts, "why": why}
        return str(RUN_REASONS[job.run_reason])

    @admin.display(description=_("held back by"))
    def held_back_by(self, job: Job) -> SafeString | str:
        """What keeps a READY job from being claimed now (:func:`.hold_reasons.held_back`)."""
        if job.status != Job.Status.READY:
            return "—"
        found = hold_reasons.held_back(job)
        if not found:
            return _(
                "nothing: it is due and free to run; a worker serving queue %(queue)s claims it "
                "next (check that one runs)"
            ) % {"queue": job.queue}
        rows = []
        for hold in found:
            if hold.job_id is None:
                rows.append(format_html("<div>{}</div>", hold.text))
                continue
            before, mark, after = hold.text.partition(f"#{hold.job_id}")
            rows.append(
                format_html(
                    '<div>{}<a href="{}">{}</a>{}</div>',
                    before,
                    reverse("admin:django_debounce_job_change", args=[hold.job_id]),
                    mark,
                    after,
                )
            )
        return format_html_join("", "{}", ((row,) for row in rows))

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

    @admin.display(description=_("result"))
    def result_pretty(self, job: Job) -> SafeString:
        return pretty_json(job.result)

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


def _never_ran_because(job: Job) -> str:
    """Why a SHED, EXPIRED or CANCELLED job did not run (one query for SHED and CANCELLED)."""
    if job.status == Job.Status.EXPIRED:
        return _("expired at %(at)s (not started by its expiry)") % {
            "at": time_text(job.expires_at or job.finished_at)
        }
    if job.status == Job.Status.SHED:
        letter = (
            DeadLetter.objects.filter(job=job)
            .order_by("-created_at", "-id")
            .values_list("kind", "reason")
            .first()
        )
        if letter is None:
            return _("shed at %(at)s") % {"at": time_text(job.finished_at)}
        kind, reason = letter
        if kind == DeadLetter.Kind.CODEL:
            return _("shed by CoDel (%(r)s)") % {"r": reason.removeprefix("codel:").strip()}
        if kind == DeadLetter.Kind.SHED:
            return _("shed by the %(r)s") % {"r": reason.removeprefix("shed:").strip()}
        return _("shed: %(r)s") % {"r": reason}
    failed = (
        job.depends_on.exclude(status__in=[Job.Status.SUCCESSFUL, Job.Status.READY])
        .exclude(status=Job.Status.RUNNING)
        .order_by("pk")
        .values_list("pk", "status")
        .first()
    )
    if failed is not None:
        return _("cancelled at %(at)s because job #%(pk)d it depends on ended %(status)s") % {
            "at": time_text(job.finished_at),
            "pk": failed[0],
            "status": failed[1],
        }
    return _("cancelled at %(at)s") % {"at": time_text(job.finished_at)}


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
        "task",
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
    only_open_windows = True

    class Media:
        js = ["django_debounce/countdown.js"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return OpenWindow.objects.open_windows()

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Django's substring search on ``debounce_key``: open windows are few (a scan is cheap)."""
        return admin.ModelAdmin.get_search_results(self, request, queryset, search_term)

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

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Exact, index-served search (:func:`.admin_helpers.exact_dead_letter_search`)."""
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


# -- flow-control state (read-only) --------------------------------------------------


@admin.register(TaskState)
class TaskStateAdmin(ReadOnlyAdmin):
    """Per-task flow-control state (§6): breaker, token bucket now, running vs cap.

    View-only, like every page here. The token level is computed for now with
    the registered task's rate (:mod:`.throttle`); the running count is one
    subquery per row of the page (live leases, as the cap counts them). A task
    with no row has never been gated yet: a full bucket and a closed breaker.
    """

    list_display = [
        "task",
        "breaker",
        "failures_count",
        "opened_at_time",
        "reset_due_at",
        "probe_job",
        "tokens_now",
        "running_vs_cap",
    ]
    list_display_links = ["task"]
    list_filter = ["breaker_state"]
    search_fields = ["=task_name"]
    search_help_text = _("Exact task name.")
    ordering = ["task_name"]
    fields = [
        "task_name",
        "breaker",
        "failures_count",
        "opened_at_time",
        "reset_due_at",
        "probe_job",
        "tokens_now",
        "running_vs_cap",
        "stored_tokens",
    ]

    task = task_name_column()
    opened_at_time = time_column("opened_at", _("opened at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        now = timezone.now()
        running = (
            Job.objects.filter(live_lease(now), task_name=OuterRef("task_name"))
            .order_by()
            .values("task_name")
            .annotate(n=Count("pk"))
            .values("n")
        )
        qs: QuerySet[Any] = super().get_queryset(request)
        qs = qs.annotate(running_now=Coalesce(Subquery(running, output_field=IntegerField()), 0))
        return qs

    def _view(self, state: TaskState) -> hold_reasons.FlowView:
        return hold_reasons.flow_view(
            state.task_name,
            state,
            now=timezone.now(),
            running=getattr(state, "running_now", None),
        )

    @admin.display(description=_("breaker"), ordering="breaker_state")
    def breaker(self, state: TaskState) -> str:
        view = self._view(state)
        if view.gate is not None and view.gate.breaker is None:
            return str(_("none declared"))
        return str(state.get_breaker_state_display())

    @admin.display(description=_("consecutive failures"), ordering="failures")
    def failures_count(self, state: TaskState) -> int:
        return state.failures

    @admin.display(description=_("reset due at"))
    def reset_due_at(self, state: TaskState) -> str:
        return time_text(self._view(state).reset_due_at)

    @admin.display(description=_("probe job"))
    def probe_job(self, state: TaskState) -> SafeString | str:
        return job_link(state.probe_job_id)

    @admin.display(description=_("tokens now"))
    def tokens_now(self, state: TaskState) -> str:
        view = self._view(state)
        if not view.registered:
            return str(_("task not registered here"))
        if view.gate is None or view.gate.bucket is None or view.tokens is None:
            return str(_("no rate limit"))
        text = f"{view.tokens:.2f} / {view.capacity} ({view.gate.bucket.text})"
        if view.next_token_at is not None:
            text += " · " + str(_("next token ~%(at)s") % {"at": time_text(view.next_token_at)})
        return text

    @admin.display(description=_("running / cap"))
    def running_vs_cap(self, state: TaskState) -> str:
        view = self._view(state)
        running = view.running if view.running is not None else "?"
        if view.cap is None:
            return f"{running} / {_('no cap')}"
        return f"{running} / {view.cap}"

    @admin.display(description=_("stored tokens (at)"))
    def stored_tokens(self, state: TaskState) -> str:
        if state.tokens is None:
            return str(_("never used (full)"))
        return f"{state.tokens:.3f} @ {time_text(state.tokens_at)}"


@admin.register(QueueState)
class QueueStateAdmin(ReadOnlyAdmin):
    """Per-queue CoDel state (§6, RFC 8289 §5), view-only."""

    list_display = [
        "queue",
        "dropping",
        "drop_count",
        "next_drop",
        "first_above",
        "last_drop_count",
    ]
    list_display_links = ["queue"]
    ordering = ["queue"]
    fields = [
        "queue",
        "dropping",
        "drop_count",
        "next_drop",
        "first_above",
        "last_drop_count",
    ]

    next_drop = time_column("drop_next_at", _("next drop"))
    first_above = time_column("first_above_at", _("first above target (+ interval)"))
