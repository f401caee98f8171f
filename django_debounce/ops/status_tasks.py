"""The per-task rules ``debounce_status`` lists: rate limits per key and edges (decisions 189, 197).

Each list has a row per registered task that has the rule, never a row per
key: counts of keys come from one grouped query
(:func:`~django_debounce.flow.key_rates.key_counts`); the edge is the task's
setting, read from the registry (no query).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import registry
from ..flow.key_rates import key_counts
from .text_width import cut_dotted, pad

#: Rows of each per-task list read at most.
MAX_TASKS = 1000


def per_key_rows(now: datetime, using: str) -> list[dict[str, Any]]:
    """Return ``{"task_name", "rate_limit_per_key", "on_excess", "keys_in_use", "keys_waiting"}``
    per task with ``rate_limit_per_key`` (decision 189), by task name."""
    keyed = {name: t for name, t in registry.all_tasks().items() if t.options.rate_limit_per_key}
    counts = key_counts(now, using=using, names=sorted(keyed)) if keyed else {}
    return [
        {
            "task_name": name,
            "rate_limit_per_key": task.options.rate_limit_per_key,
            "on_excess": task.options.on_excess,
            "keys_in_use": counts.get(name, (0, 0))[0],
            "keys_waiting": counts.get(name, (0, 0))[1],
        }
        for name, task in sorted(keyed.items())
    ][:MAX_TASKS]


def edge_rows() -> list[dict[str, Any]]:
    """Return ``{"task_name", "edge", "debounce", "max_wait"}`` (seconds) per debounced task
    whose ``debounce_edge`` is ``"leading"`` or ``"both"`` (decision 180), by task name."""
    rows = []
    for name, task in sorted(registry.all_tasks().items()):
        options = task.options
        if options.debounce is None or options.debounce_edge == "trailing":
            continue
        rows.append(
            {
                "task_name": name,
                "edge": options.debounce_edge,
                "debounce": options.debounce.total_seconds(),
                "max_wait": (
                    options.debounce_max_wait.total_seconds()
                    if options.debounce_max_wait is not None
                    else None
                ),
            }
        )
    return rows[:MAX_TASKS]


def per_key_lines(rows: list[dict[str, Any]], task_col: int) -> list[str]:
    """The text lines of :func:`per_key_rows`, the task name ``task_col`` wide."""
    return [
        f"  {pad(cut_dotted(b['task_name'], task_col), task_col)}"
        f" {b['rate_limit_per_key']:>8} {b['keys_in_use']:>6} in use {b['keys_waiting']:>6} waiting"
        for b in rows
    ]


def edge_lines(rows: list[dict[str, Any]], task_col: int) -> list[str]:
    """The text lines of :func:`edge_rows`: edge, window and max wait, in seconds."""
    return [
        f"  {pad(cut_dotted(e['task_name'], task_col), task_col)} {e['edge']:<8}"
        f" window {_secs(e['debounce']):>6} max {_secs(e['max_wait']):>6}"
        for e in rows
    ]


def _secs(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:g}s"
