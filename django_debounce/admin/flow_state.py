"""The flow-control state pages (contract §6), read-only.

:class:`TaskStateAdmin`: per task, breaker, token bucket as of now and running
vs cap. :class:`QueueStateAdmin`: per queue, the CoDel state.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..flow import hold_reasons
from ..flow.rules import live_lease
from ..models import Job, KeyBucket, QueueState, TaskState
from .base import ReadOnlyAdmin
from .helpers import (
    job_link,
    task_name_column,
    time_column,
    time_text,
)


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
        "per_key",
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
        "per_key",
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
        # Per-key buckets in use and waiting (decision 189): two counts per row, never the keys.
        for label, extra in (("keys_in_use", Q()), ("keys_waiting", Q(blocked_until__gt=now))):
            keys = (
                KeyBucket.objects.filter(extra, task_name=OuterRef("task_name"), full_at__gt=now)
                .order_by()
                .values("task_name")
                .annotate(n=Count("pk"))
                .values("n")
            )
            qs = qs.annotate(**{label: Coalesce(Subquery(keys, output_field=IntegerField()), 0)})
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

    @admin.display(description=_("rate limit per key"))
    def per_key(self, state: TaskState) -> str:
        """The task's ``rate_limit_per_key`` and how many keys use a bucket now (never the keys)."""
        view = self._view(state)
        if view.gate is None or view.gate.key_bucket is None:
            return str(_("none declared")) if view.registered else "-"
        used, waiting = getattr(state, "keys_in_use", "?"), getattr(state, "keys_waiting", "?")
        return str(
            _("%(rate)s per key · %(used)s keys in use, %(waiting)s waiting for a token")
            % {"rate": view.gate.key_bucket.text, "used": used, "waiting": waiting}
        )

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
