"""``manage.py plot_edges``: the three window edges run on one stream of calls (decision 180).

The same calls go to ``edge_trailing``, ``edge_leading`` and ``edge_both``
(window 10 s, max wait 30 s) on a virtual clock (time-machine); every job runs
at its exact due time through the real worker (``run_debounce_worker
--burst``), and the picture shows each call as a tick and each run as a dot
labelled with the call whose arguments it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.core.management import call_command

from django_debounce.models import Job

from .plot import load_matplotlib
from .tasks import edge_both, edge_leading, edge_trailing

#: The calls, in seconds: a short burst, a stream past the ceiling, a lone call.
CALLS: tuple[float, ...] = (0, 3, 7, *range(30, 70, 4), 90)
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TASKS = (("trailing", edge_trailing), ("leading", edge_leading), ("both", edge_both))


def run_edges(calls: Sequence[float] = CALLS) -> dict[str, list[tuple[float, float]]]:
    """Make ``calls`` of each edge task and run every job when due; return its runs.

    Returns:
        By edge name, ``(run time, t of the call it ran)`` in seconds after the
        first call, in order. Earlier jobs of the three tasks are deleted first.
    """
    import time_machine  # the demo's dependency, not the package's

    names = [t.name for _, t in TASKS]
    Job.objects.filter(task_name__in=names).delete()
    with time_machine.travel(START, tick=False) as traveller:

        def run_due(until: float) -> None:
            while True:
                job = Job.objects.filter(task_name__in=names, status="READY").order_by("run_at")
                first = job.first()
                if first is None or first.run_at > START + timedelta(seconds=until):
                    return
                traveller.move_to(first.run_at)
                call_command("run_debounce_worker", burst=True, verbosity=0)

        for at in calls:
            run_due(at)
            traveller.move_to(START + timedelta(seconds=at))
            for _, t in TASKS:
                t.delay("guide", t=at)
            run_due(at)
        run_due(max(calls) + 120)
    runs: dict[str, list[tuple[float, float]]] = {}
    for edge, t in TASKS:
        done = Job.objects.filter(task_name=t.name, status="SUCCESSFUL").order_by("started_at")
        runs[edge] = [
            ((job.started_at - START).total_seconds(), float(job.kwargs["t"]))
            for job in done
            if job.started_at is not None
        ]
    return runs


def draw(path: Path, runs: dict[str, list[tuple[float, float]]], calls: Sequence[float]) -> None:
    """Draw the calls and ``runs`` of each edge, one row each, to ``path`` (1200 x 450 px)."""
    _, canvas_class, figure_class = load_matplotlib()
    figure = figure_class(figsize=(12.0, 4.5), dpi=100)
    canvas_class(figure)
    axes = figure.add_subplot(1, 1, 1)
    rows = list(runs)
    for row, edge in enumerate(reversed(rows)):
        axes.vlines(calls, row - 0.25, row + 0.25, color="#999999", linewidth=1)
        times = [at for at, _ in runs[edge]]
        axes.plot(times, [row] * len(times), "o", color="#1f77b4", markersize=9)
        previous = None
        for at, payload in runs[edge]:
            below = previous is not None and at - previous < 5  # two runs close together
            axes.annotate(
                f"t={payload:g}",
                (at, row),
                xytext=(0, -16 if below else 9),
                textcoords="offset points",
                ha="center",
                fontsize=8,
            )
            previous = at
    axes.set_yticks(range(len(rows)), [f'"{edge}"' for edge in reversed(rows)])
    axes.set_ylim(-0.6, len(rows) - 0.3)
    axes.set_xlabel(
        "seconds (window 10 s, max wait 30 s); ticks: calls, dots: runs (t = the call run)"
    )
    axes.set_title("debounce_edge: the same calls, three edges")
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
