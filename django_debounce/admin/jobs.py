"""The jobs and open-windows pages (contract §4.1, §9).

:class:`JobAdmin` lists every job; its detail page says why the job ran when it
did (:data:`RUN_REASONS`), what holds a READY job back (:mod:`django_debounce.flow.hold_reasons`)
and why a job never ran. :class:`OpenWindowAdmin` lists the open debounce
windows with a live countdown. Both carry the "Run now" and "Cancel" actions
(:mod:`.window_actions`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..flow import hold_reasons
from ..models import DeadLetter, Job, OpenWindow
from ..ops import edge_runs
from ..progress import progress_of
from .helpers import (
    QueueFilter,
    TaskNameFilter,
    countdown_html,
    exact_job_search,
    job_link,
    payload_preview,
    pretty_json,
    progress_html,
    time_column,
    time_text,
)
from .window_actions import WindowActionsAdmin

#: Why a job became due when it did (``Job.run_reason``), in operators' words.
RUN_REASONS = {
    "quiet": _("the window went quiet: no call for one window length after the last call"),
    "max_wait": _("max wait reached: calls kept coming until the ceiling (opened + max wait)"),
    "not_debounced": _("not debounced: it was due at its run_at"),
    "retry": _("a retry: an earlier attempt failed or its worker stopped; see attempts and error"),
}


@admin.register(Job)
class JobAdmin(WindowActionsAdmin):
    """All jobs, newest first; the detail explains why the job ran when it did."""

    list_display = [
        "id",
        "task",
        "queue",
        "status",
        "key",
        "edge",
        "priority",
        "run_at_time",
        "enqueue_count",
        "attempts",
        "progress",
        "created_at_time",
    ]
    list_filter = ["status", QueueFilter, TaskNameFilter, ("created_at", admin.DateFieldListFilter)]
    search_fields = ["=id", "=debounce_key", "=task_name"]
    search_help_text = _("Exact job id, debounce key or task name.")
    actions = ["run_now", "cancel", "cancel_running"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Exact, index-served search (:func:`.helpers.exact_job_search`; issue #4)."""
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
                    "progress",
                    "why_it_ran",
                    "held_back_by",
                    "window",
                    "edge_run",
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
        """Calls that joined the window after the one that opened it (decision 161)."""
        return job.enqueue_count - 1

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The jobs, each marked with its run of a burst (:func:`.edge_runs.with_run_edges`)."""
        return edge_runs.with_run_edges(super().get_queryset(request))

    @admin.display(description=_("edge"))
    def edge(self, job: Job) -> str:
        """The job's run of its burst, ``leading`` or ``trailing`` (decision 197); ``—`` if none."""
        return edge_runs.run_edge(job) or "—"

    @admin.display(description=_("edge"))
    def edge_run(self, job: Job) -> str:
        """Which run of its burst the job is and which calls it stands for (decisions 180, 197)."""
        run = edge_runs.run_edge(job)
        if run is None:
            return "—"
        setting = edge_runs.task_edge(job.task_name)
        others = job.enqueue_count - 1
        if run == edge_runs.LEADING:
            if setting == "both":
                return str(
                    _(
                        "leading run (debounce_edge='both'): the burst's first call, due at "
                        "once; the burst's later calls go to its trailing run"
                    )
                )
            return ngettext(
                "leading run (debounce_edge='leading'): the burst's first call, due at once; "
                "%(n)d later call was swallowed (last %(last)s)",
                "leading run (debounce_edge='leading'): the burst's first call, due at once; "
                "%(n)d later calls were swallowed (last %(last)s)",
                others,
            ) % {"n": others, "last": time_text(job.last_enqueued_at)}
        if setting == "both":
            return ngettext(
                "trailing run (debounce_edge='both'): %(n)d call after the burst's leading run "
                "collapsed into it (%(first)s to %(last)s)",
                "trailing run (debounce_edge='both'): %(n)d calls after the burst's leading run "
                "collapsed into it (%(first)s to %(last)s)",
                job.enqueue_count,
            ) % {
                "n": job.enqueue_count,
                "first": time_text(job.created_at),
                "last": time_text(job.last_enqueued_at),
            }
        return ngettext(
            "trailing run: %(n)d call collapsed into it (%(first)s to %(last)s)",
            "trailing run: %(n)d calls collapsed into it (%(first)s to %(last)s)",
            job.enqueue_count,
        ) % {
            "n": job.enqueue_count,
            "first": time_text(job.opened_at),
            "last": time_text(job.last_enqueued_at),
        }

    @admin.display(description=_("progress"))
    def progress(self, job: Job) -> str:
        """The latest run's progress as a ``<progress>`` bar with its text (decision 202)."""
        return progress_html(progress_of(job))

    @admin.display(description=_("key"))
    def key(self, job: Job) -> str:
        key = job.debounce_key or job.unique_key or ""
        return key if len(key) <= 40 else key[:39] + "…"

    @admin.display(description=_("why it ran when it did"))
    def why_it_ran(self, job: Job) -> str:
        if job.is_open_window:
            if job.run_at <= timezone.now():  # due, not claimed yet: held back, or about to run
                return _(
                    "due since %(due)s (%(r)s) and not started yet: see “held back by”; "
                    "calls that come meanwhile still join it"
                ) % {"due": time_text(job.run_at), "r": RUN_REASONS[job.run_reason]}
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
        """What keeps a READY job from being claimed now (:func:`django_debounce.flow.hold_reasons.held_back`)."""
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
        "edge",
        "opened_at_time",
        "deadline",
        "ceiling",
        "calls",
        "last_call",
        "payload",
        "queue",
    ]
    list_display_links = None
    list_filter = [TaskNameFilter, QueueFilter]
    search_fields = ["debounce_key"]
    search_help_text = _("Part of the debounce key.")
    ordering = ["run_at", "id"]
    only_open_windows = True

    class Media:
        js = ["django_debounce/countdown.js"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return edge_runs.with_run_edges(OpenWindow.objects.open_windows())

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
