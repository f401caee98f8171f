"""The "Run now" and "Cancel" actions on READY jobs (:mod:`django_debounce.ops.windows`).

:class:`WindowActionsAdmin` holds them, their permission (``change_job``) and
their messages; the jobs and open-windows pages (:mod:`.jobs`) inherit it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..flow import hold_reasons
from ..models import Job
from ..ops import cancels, windows
from .base import MAX_ACTION_ROWS, CallDisplayAdmin


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
        """Make the selected READY jobs due now (:func:`django_debounce.ops.windows.run_now`)."""
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
        """Cancel the selected READY jobs and their dependents (:func:`django_debounce.ops.windows.cancel`)."""
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

    @admin.action(description=_("Cancel, asking running jobs to stop"), permissions=["windows"])
    def cancel_running(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Cancel the selected jobs, RUNNING ones by request (:func:`django_debounce.ops.cancels.cancel_jobs`, decision 186)."""
        if not self.has_windows_permission(request):
            raise PermissionDenied
        ids = self._selected(request, queryset)
        if ids is None:
            return
        result = cancels.cancel_jobs(ids)
        if result.cancelled:
            count = len(result.cancelled) + len(result.cancelled_dependents)
            text = ngettext("%(count)d job cancelled.", "%(count)d jobs cancelled.", count)
            self.message_user(request, text % {"count": count}, messages.SUCCESS)
        if result.requested:
            text = ngettext(
                "Cancel requested for %(count)d running job: it stops at its next checkpoint "
                "(a task that never checks runs to its end): %(ids)s.",
                "Cancel requested for %(count)d running jobs: they stop at their next "
                "checkpoint (a task that never checks runs to its end): %(ids)s.",
                len(result.requested),
            )
            ids_text = ", ".join(f"#{pk}" for pk in result.requested)
            self.message_user(
                request, text % {"count": len(result.requested), "ids": ids_text}, messages.INFO
            )
        if result.finished:
            text = ngettext(
                "%(count)d job left alone: it already finished.",
                "%(count)d jobs left alone: they already finished.",
                len(result.finished),
            )
            self.message_user(request, text % {"count": len(result.finished)}, messages.WARNING)
