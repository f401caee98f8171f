"""``manage.py plot_rules``: throttle, coalesce and debounce run on one stream of calls (decision 176).

The same calls go to ``rule_throttle`` (``rate_limit="1/5s"``), ``rule_coalesce``
(``unique_key``, each call with ``countdown=10``) and ``rule_debounce`` (window 10 s,
max wait 30 s) on a virtual clock (time-machine) stepped a second at a time; every
due job runs through the real worker (``run_debounce_worker --burst``). The picture
(docs/explanation/throttle-coalesce-debounce.md) shows each call as a tick and each
run as a dot labelled with the call whose arguments it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management import call_command

from django_debounce.models import Job

from . import rule_tasks
from .plot import load_matplotlib

#: The calls, in whole seconds: a burst of five, a steady stream past the ceiling, a lone call.
CALLS: tuple[int, ...] = (0, 2, 4, 6, 8, *range(30, 70, 4), 90)
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: The rules, in plot order (their tasks are registered while :func:`run_rules` runs).
RULES = tuple(rule_tasks.NAMES)
#: The coalesced calls' countdown, in seconds: the first call of a key waits this long.
COUNTDOWN = 10


def _call(tasks: dict[str, Any], rule: str, at: int) -> None:
    task = tasks[rule]
    if rule == "coalesce":
        task.apply_async(("guide",), {"t": at}, countdown=COUNTDOWN)
    else:
        task.delay("guide", t=at)


def run_rules(calls: Sequence[int] = CALLS) -> dict[str, list[tuple[float, float]]]:
    """Make ``calls`` of each rule's task and run what is due, second by second.

    Returns:
        By rule name, ``(run time, t of the call it ran)`` in seconds after the
        first call, in order. Earlier jobs of the three tasks are deleted first.
    """
    import time_machine  # the demo's dependency, not the package's

    tasks = rule_tasks.register()
    try:
        names = [t.name for t in tasks.values()]
        Job.objects.filter(task_name__in=names).delete()
        due = Job.objects.filter(task_name__in=names, status="READY")
        with time_machine.travel(START, tick=False) as traveller:
            at = 0
            while at <= max(calls) or due.exists():
                traveller.move_to(START + timedelta(seconds=at))
                for _ in range(calls.count(at)):
                    for rule in RULES:
                        _call(tasks, rule, at)
                if due.filter(run_at__lte=START + timedelta(seconds=at)).exists():
                    call_command("run_debounce_worker", burst=True, verbosity=0)
                at += 1
    finally:
        rule_tasks.unregister()
    runs: dict[str, list[tuple[float, float]]] = {}
    for rule in RULES:
        done = Job.objects.filter(task_name=rule_tasks.NAMES[rule], status="SUCCESSFUL").order_by(
            "started_at", "id"
        )
        runs[rule] = [
            ((job.started_at - START).total_seconds(), float(job.kwargs["t"]))
            for job in done
            if job.started_at is not None
        ]
    return runs


def draw(path: Path, runs: dict[str, list[tuple[float, float]]], calls: Sequence[int]) -> None:
    """Draw the calls and ``runs`` of each rule, one row each, to ``path`` (1200 x 450 px)."""
    _, canvas_class, figure_class = load_matplotlib()
    figure = figure_class(figsize=(12.0, 4.5), dpi=100)
    canvas_class(figure)
    axes = figure.add_subplot(1, 1, 1)
    rows = list(runs)
    for row, rule in enumerate(reversed(rows)):
        axes.vlines(calls, row - 0.25, row + 0.25, color="#999999", linewidth=1)
        times = [at for at, _ in runs[rule]]
        axes.plot(times, [row] * len(times), "o", color="#1f77b4", markersize=9)
        for index, (at, payload) in enumerate(runs[rule]):
            axes.annotate(
                f"t={payload:g}",
                (at, row),
                xytext=(0, -16 if index % 2 else 9),  # alternate, so close runs stay legible
                textcoords="offset points",
                ha="center",
                fontsize=8,
            )
    axes.set_yticks(range(len(rows)), list(reversed(rows)))
    axes.set_ylim(-0.6, len(rows) - 0.3)
    axes.set_xlabel(
        'seconds; throttle: rate_limit="1/5s"; coalesce: unique_key, countdown 10 s; '
        "debounce: window 10 s, max wait 30 s; ticks: calls, dots: runs (t = the call run)"
    )
    axes.set_title("The same calls, three rules")
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
