"""Which run of a burst a job is: its leading run or its trailing run (decision 197).

A task declared with ``debounce_edge="leading"`` or ``"both"`` (decision 180)
writes a burst as one or two rows: the **leading job**, which opened the burst
and is due at once, and, for ``"both"``, the **trailing job**, created by the
burst's second call with the burst's ``opened_at`` and ceiling. So a job's
run is read from its rows, with no column of its own: a job of such a task is
the burst's *trailing* run when an older row of its key (``key_hash``, lower
id) has the same ``opened_at`` and ``max_run_at``, else its *leading* run.
Every job of a debounced ``"trailing"`` task is a trailing run; a job that is
not debounced, or whose task this process never imported, has no edge.

The admin (jobs, open windows, job detail), ``debounce_status`` and the
Prometheus ``django_debounce_edge_runs_total`` counter read it from here.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from .. import registry
from ..models import Job

__all__ = ["LEADING", "TRAILING", "edge_tasks", "run_edge", "task_edge", "with_run_edges"]

#: The run that starts a burst at once (``debounce_edge="leading"`` or ``"both"``).
LEADING = "leading"
#: The run after the calls went quiet (every debounced task's run but a burst's first).
TRAILING = "trailing"
#: The annotation :func:`with_run_edges` adds: True on a later row of a burst.
ANNOTATION = "later_in_burst"


def task_edge(task_name: str) -> str | None:
    """Return the ``debounce_edge`` of the task registered as ``task_name``.

    Returns:
        ``"trailing"``, ``"leading"`` or ``"both"`` for a debounced task;
        ``None`` for a task that is not debounced or not registered here.
    """
    found = registry.lookup(task_name)
    if found is None or found.options.debounce is None:
        return None
    return found.options.debounce_edge


def edge_tasks() -> list[str]:
    """Return the names of the registered tasks whose edge is ``"leading"`` or ``"both"``."""
    return sorted(
        name
        for name, task in registry.all_tasks().items()
        if task.options.debounce is not None and task.options.debounce_edge != "trailing"
    )


def _later_in_burst() -> Exists:
    return Exists(
        Job.objects.filter(
            key_hash=OuterRef("key_hash"),
            opened_at=OuterRef("opened_at"),
            max_run_at=OuterRef("max_run_at"),
            pk__lt=OuterRef("pk"),
        )
    )


def with_run_edges(jobs: QuerySet[Any]) -> QuerySet[Any]:
    """Return ``jobs`` annotated so :func:`run_edge` needs no query per job.

    Adds ``later_in_burst`` (an ``EXISTS`` on the ``key_hash`` index) only
    when some registered task has a leading or both edge; otherwise ``jobs``
    unchanged, so a project without such tasks pays nothing.
    """
    if not edge_tasks():
        return jobs
    annotated: QuerySet[Any] = jobs.annotate(**{ANNOTATION: _later_in_burst()})
    return annotated


def run_edge(job: Job) -> str | None:
    """Return which run of its burst ``job`` is: :data:`LEADING`, :data:`TRAILING` or ``None``.

    Args:
        job: a job row; annotated by :func:`with_run_edges`, or not (then one
            query for a job of a leading or both task).

    Returns:
        ``None`` when the job is not debounced or its task is not registered
        in this process; :data:`TRAILING` for every job of a ``"trailing"``
        task and for a both burst's second job; :data:`LEADING` for a
        leading or both burst's first job (decision 197).
    """
    edge = task_edge(job.task_name)
    if edge is None or job.opened_at is None:
        return None
    if edge == "trailing":
        return TRAILING
    later = getattr(job, ANNOTATION, None)
    if later is None:
        later = (
            Job.objects.using(job._state.db or "default")
            .filter(
                key_hash=job.key_hash,
                opened_at=job.opened_at,
                max_run_at=job.max_run_at,
                pk__lt=job.pk,
            )
            .exists()
        )
    return TRAILING if later else LEADING
