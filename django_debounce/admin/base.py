"""The base ModelAdmins every page builds on, and the action row limit.

:class:`ReadOnlyAdmin`: no add, change or delete, bounded changelists (capped
count via :class:`~.helpers.CappedCountPaginator`, no facets) and the
:data:`MAX_ACTION_ROWS` guard every action uses. :class:`CallDisplayAdmin`: the
read-only displays of a stored call (arguments, metadata, traceback) shared by
jobs and dead letters.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import DeadLetter, Job
from .helpers import (
    CappedCountPaginator,
    pretty_json,
    task_name_column,
)

#: An action handles at most this many selected rows per click.
MAX_ACTION_ROWS = 1_000


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
