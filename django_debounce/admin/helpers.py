"""Building blocks of the admin (:mod:`django_debounce.admin`): paginator, filters, display.

Kept apart so the page modules hold only the ModelAdmins. Nothing here writes.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import CharField, Func, Q, QuerySet, Value
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from .. import keys, registry
from ..conf import Settings
from ..job_ids import parse_id
from ..models import DeadLetter
from ..progress import Progress

#: A changelist counts at most this many matching rows (then shows "more than …").
COUNT_CAP = 10_000

#: The dead-letter kinds the admin filters by (§6, §7, §8); ``other`` is shown, not offered.
KINDS = [kind for kind in DeadLetter.Kind if kind != DeadLetter.Kind.OTHER]


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that counts at most :data:`COUNT_CAP` rows.

    Django's paginator runs ``SELECT COUNT(*)`` over every matching row on
    each page load; on a table of a million jobs that is a full scan. This one
    counts ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``: at most ``cap + 1``
    rows are read, so the pages stop at the cap and the changelist says "more
    than 10000" (filter or search to narrow it down).
    """

    cap = COUNT_CAP

    @cached_property
    def count(self) -> int:
        """Return the number of matching rows, at most :attr:`cap`."""
        rows = self.object_list
        if isinstance(rows, QuerySet):
            counted = rows.order_by()[: self.cap + 1].count()
        else:
            counted = len(rows)
        self.capped = counted > self.cap
        return min(counted, self.cap)

    capped = False
    """True when more than :attr:`cap` rows matched (set by :attr:`count`)."""


def format_countdown(seconds: float) -> str:
    """Return ``"in 4 m 12 s"`` for a deadline ``seconds`` ahead (``"overdue by 3 s"`` if past).

    Two units: the largest of d, h, m, s that is non-zero, and the next one
    (``"in 1 m 0 s"``); whole seconds, truncated toward zero. The countdown
    script (``static/django_debounce/countdown.js``) formats the same way.
    """
    whole = int(seconds) if seconds >= 0 else -int(-seconds)
    if whole == 0:
        return "due now"
    left = abs(whole)
    parts: list[str] = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if left >= size or parts:
            amount, left = divmod(left, size)
            parts.append(f"{amount} {unit}")
            if len(parts) == 2:
                break
    text = " ".join(parts)
    return f"in {text}" if whole > 0 else f"overdue by {text}"


#: Times to the second: a debounce window is seconds long (current time zone, ``TIME_ZONE``).
TIME_FORMAT = "Y-m-d H:i:s"


def time_text(value: datetime | None) -> str:
    return "—" if value is None else date_format(timezone.localtime(value), TIME_FORMAT)


def time_column(field: str, label: Any) -> Any:
    """Return a ModelAdmin display method showing ``field`` to the second, sortable."""

    @admin.display(description=label, ordering=field)
    def show(self: Any, obj: Any) -> str:
        return time_text(getattr(obj, field))

    show.__name__ = f"{field}_time"
    return show


def countdown_html(deadline: datetime, now: datetime | None = None) -> SafeString:
    """Return the countdown ``<time>`` element for ``deadline``: server text, updated by script."""
    now = now or timezone.now()
    return format_html(
        '<time class="debounce-countdown" datetime="{}" data-now="{}" title="{}">{}</time>',
        deadline.isoformat(),
        now.isoformat(),
        time_text(deadline),
        format_countdown((deadline - now).total_seconds()),
    )


def pretty_json(value: Any) -> SafeString:
    return format_html(
        '<pre class="debounce-pre">{}</pre>', json.dumps(value, indent=2, sort_keys=True)
    )


def payload_preview(args: Any, kwargs: Any, limit: int = 80) -> str:
    parts = []
    if args:
        parts.append(json.dumps(args, separators=(", ", ": ")))
    if kwargs:
        parts.append(json.dumps(kwargs, separators=(", ", ": "), sort_keys=True))
    text = " ".join(parts) or "(no arguments)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def breakable_name(name: str) -> SafeString:
    """Return the dotted ``name`` escaped, with a line-break opportunity after each ``.``/``_``.

    A long task name (``billing.tasks.rebuild_customer_invoice_summary``) then wraps
    between its parts instead of widening its changelist column off a laptop screen
    (``<wbr>``: no character is added, the text stays the same when copied).
    """
    return format_html_join(
        mark_safe("<wbr>"), "{}", ((part,) for part in re.split(r"(?<=[._])", name))
    )


def task_name_column() -> Any:
    """Return a ModelAdmin display method showing ``task_name`` wrappable, sortable."""

    @admin.display(description=_("task name"), ordering="task_name")
    def task(self: Any, obj: Any) -> SafeString:
        return breakable_name(obj.task_name)

    return task


def job_link(job_id: int | None) -> SafeString | str:
    if job_id is None:
        return "—"
    url = reverse("admin:django_debounce_job_change", args=[job_id])
    return format_html('<a href="{}">#{}</a>', url, job_id)


# -- filters -------------------------------------------------------------------------


class TaskNameFilter(admin.SimpleListFilter):
    """Filter a changelist by task name; choices are the registered tasks (no query over the table)."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registry.all_tasks())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(task_name=value) if value else queryset


class QueueFilter(admin.SimpleListFilter):
    """Filter by queue; choices are the tasks' queues and ``DEBOUNCE_QUEUES`` (no table query)."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Every queue the setting names, CoDel on or off; read as given (not parsed), so a
        # malformed DEBOUNCE_QUEUES (check E012) does not break the change list.
        configured = Settings.codel.raw()
        names = {"default", *(configured if isinstance(configured, dict) else {})}
        names.update(task.options.queue for task in registry.all_tasks().values())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class KindFilter(admin.SimpleListFilter):
    """Dead-letter kind: failure, shed, codel, unknown task (§8), from the ``kind`` column.

    The index on (``kind``, ``-created_at``) serves the newest-first page of
    one kind: an index seek, however large the table.
    """

    title = _("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(kind.value, kind.label) for kind in KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(kind=value) if value in {k.value for k in KINDS} else queryset


class ErrorTypeFilter(admin.SimpleListFilter):
    """Failure reason by exception type (``error`` up to ``": "``), from the newest entries.

    The choices come from the newest :attr:`sample` dead letters (one bounded
    query along the ``created_at`` index), not from the whole table.
    """

    title = _("reason (error type)")
    parameter_name = "error_type"
    sample = 500

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = DeadLetter.objects.order_by("-created_at").values_list("error", flat=True)
        names = {error.split(": ", 1)[0] for error in recent[: self.sample] if ": " in error}
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(error__startswith=f"{value}: ") if value else queryset


class RetriedFilter(admin.SimpleListFilter):
    """Whether the entry was retried already."""

    title = _("retried")
    parameter_name = "retried"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(retried_at__isnull=self.value() == "no")
        return queryset


# -- search --------------------------------------------------------------------------


def _exactly(queryset: QuerySet[Any], field: str, term: str) -> Q:
    """Return a filter for ``field`` equal to ``term`` character for character, case included.

    PostgreSQL and SQLite compare text exactly. MariaDB/MySQL compare under the
    column's collation (by default case- and accent-insensitive:
    ``utf8mb4_general_ci`` says ``"A" = "a"``); there the plain comparison
    still seeks the column's index and finds the few values the collation
    calls equal, and a comparison with ``CAST(term AS BINARY)`` keeps the
    exact ones (a binary comparison, whatever the column's character set). A
    binary collation on the column would need a migration naming a
    MariaDB-only collation and would change every other comparison of the
    column; see docs/howto/databases.md.
    """
    match = Q(**{field: term})
    if connections[queryset.db].vendor == "mysql":
        binary = Func(
            Value(term), template="CAST(%(expressions)s AS BINARY)", output_field=CharField()
        )
        match &= Q(**{field: binary})
    return match


def exact_job_search(queryset: QuerySet[Any], search_term: str) -> QuerySet[Any]:
    """Filter jobs whose id, debounce key or task name equals ``search_term`` (stripped).

    Every branch is an index seek, so a search stays fast on a table of
    millions (issue #4): the id by primary key; the task name exactly (the
    ``task_name`` index; Django's ``=field`` search would compare
    ``UPPER(…)`` and read every row); the debounce key through ``key_hash``,
    the hash of (task name, key) computed for each registered task (the
    ``key_hash`` index; ``debounce_key`` itself is unindexed TEXT of up to
    4096 characters). So a key is found only for jobs of tasks registered in
    this process. The whole term is one value: keys may contain spaces.
    Task names compare case-sensitively on every database (:func:`_exactly`);
    keys do through their hash.
    """
    term = search_term.strip()
    if not term:
        return queryset
    hashes = [keys.window_hash(name, term) for name in sorted(registry.all_tasks())]
    match = _exactly(queryset, "task_name", term) | Q(key_hash__in=hashes)
    pk = parse_id(term)
    if pk is not None:
        match |= Q(pk=pk)
    return queryset.filter(match)


def exact_dead_letter_search(queryset: QuerySet[Any], search_term: str) -> QuerySet[Any]:
    """Filter dead letters whose id, original job id or task name equals ``search_term``.

    Index seeks only (issue #4): the primary key, the ``job`` foreign key and
    the ``task_name`` index; the whole stripped term is one value, a task
    name compared case-sensitively on every database (:func:`_exactly`).
    """
    term = search_term.strip()
    if not term:
        return queryset
    match = _exactly(queryset, "task_name", term)
    pk = parse_id(term)
    if pk is not None:
        match |= Q(pk=pk) | Q(job_id=pk)
    return queryset.filter(match)


def progress_html(progress: Progress | None) -> str:
    """A run's progress as an accessible bar: ``<progress>`` with the same words beside it.

    ``"-"`` without progress. With a total, ``<progress value=done max=total>``; without
    one, an indeterminate ``<progress>`` (no value). The text (``"3 of 10 (30%) - note"``)
    follows the bar and labels it (``aria-label``), so it reads the same without CSS.
    """
    if progress is None:
        return "-"
    text = progress.text()
    if progress.total is None:
        bar = format_html('<progress aria-label="{}"></progress>', text)
    else:
        bar = format_html(
            '<progress value="{}" max="{}" aria-label="{}"></progress>',
            progress.done if progress.total else 1,
            progress.total or 1,  # an empty total is all done; max must be positive
            text,
        )
    return format_html('<span class="debounce-progress">{} {}</span>', bar, text)
