"""The admin: open windows, jobs, dead letters and flow-control state (contract §6, §8, §9).

Every page is read-only: rows change only through the package's transitions,
here the actions "Run now" and "Cancel" (READY jobs, :mod:`django_debounce.ops.windows`) and
"Retry selected" (dead letters, :meth:`.DeadLetter.retry`). There is no add,
change or delete anywhere. A READY job's page says what holds it back
(:mod:`django_debounce.flow.hold_reasons`); the task and queue state pages show breakers, token
buckets, caps and CoDel as of now.

Changelists stay cheap on large tables (issue #4, 1M jobs): a page load runs a
fixed number of queries whatever the page size; the count is capped
(:class:`~.helpers.CappedCountPaginator`, no unbounded ``COUNT(*)``),
facets are off, and the task and queue filters take their choices from the
task registry and ``DEBOUNCE_QUEUES`` instead of a ``SELECT DISTINCT`` over
the table. Paginator, filters and display helpers live in :mod:`.helpers`.

One module per page family, each registering its ModelAdmins on import:
:mod:`.base` (the read-only bases, :data:`~.base.MAX_ACTION_ROWS`),
:mod:`.window_actions` ("Run now" and "Cancel"), :mod:`.jobs` (jobs, open
windows), :mod:`.dead_letters`, :mod:`.flow_state` (task and queue state) and
:mod:`.periodic` (periodic ticks).
Importing this package (Django's admin autodiscovery) imports them all; the
names are re-exported here.
"""

from .base import MAX_ACTION_ROWS, CallDisplayAdmin, ReadOnlyAdmin
from .dead_letters import DeadLetterAdmin
from .flow_state import QueueStateAdmin, TaskStateAdmin
from .jobs import RUN_REASONS, JobAdmin, OpenWindowAdmin
from .periodic import PeriodicTickAdmin
from .window_actions import WindowActionsAdmin

__all__ = [
    "MAX_ACTION_ROWS",
    "RUN_REASONS",
    "CallDisplayAdmin",
    "DeadLetterAdmin",
    "JobAdmin",
    "OpenWindowAdmin",
    "PeriodicTickAdmin",
    "QueueStateAdmin",
    "ReadOnlyAdmin",
    "TaskStateAdmin",
    "WindowActionsAdmin",
]
