"""The example's tasks (imported by django_debounce's autodiscovery of ``tasks`` modules)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.models import Job

from .models import DocBuild


@debounced_task(debounce="1h", debounce_max_wait="2h", debounce_key="docs:{directory}")
def rebuild_docs(directory: str) -> dict[str, Any]:
    """Rebuild the pages of one folder; record the run as a :class:`DocBuild`.

    The window and max wait above are defaults: ``replay_events`` passes its
    own per call. The task does not receive its job, but runs of one debounce
    key never overlap (§4.5), so the one RUNNING job of ``docs:<directory>``
    is this run's job.
    """
    now = timezone.now()
    job = (
        Job.objects.filter(
            task_name=rebuild_docs.name, debounce_key=f"docs:{directory}", status=Job.Status.RUNNING
        )
        .order_by("-started_at", "-id")
        .first()
    )
    build = DocBuild(directory=directory, ran_at=now, run_reason=DocBuild.RunReason.INLINE)
    if job is not None:
        build.job = job
        build.calls = job.enqueue_count
        build.opened_at = job.opened_at
        build.run_reason = job.run_reason
    build.save()
    return {"directory": directory, "calls": build.calls}


#: The three edges side by side (``manage.py plot_edges``, decision 180): one window each.
EDGE_WINDOW = {"debounce": "10s", "debounce_max_wait": "30s", "debounce_key": "edge:{doc}"}


@debounced_task(**EDGE_WINDOW)
def edge_trailing(doc: str, t: float) -> float:
    """Trailing edge (the default): runs after quiet, with the first call's ``t``."""
    return t


@debounced_task(debounce_edge="leading", **EDGE_WINDOW)
def edge_leading(doc: str, t: float) -> float:
    """Leading edge: a burst's first call runs at once; the rest are swallowed."""
    return t


@debounced_task(debounce_edge="both", debounce_replace_payload=True, **EDGE_WINDOW)
def edge_both(doc: str, t: float) -> float:
    """Both edges: the first call at once, then one trailing run with the newest ``t``."""
    return t


@task
def ping() -> str:
    """A no-op job: ``replay_events --real-time`` waits for it to know its worker is up."""
    return "pong"
