"""What ``manage.py debounce_status`` shows: a snapshot of the queues, read from the database.

:func:`collect_status` takes the snapshot as plain JSON-ready data (the
``--format json`` output); :func:`render_status` draws it as text that fits 80
columns. Every query is bounded by the live part of the job table or by an
index range, never by the history (issue #11, item 2; decision 111):

- READY, due and RUNNING counts per queue read the rows under
  ``status='READY'`` / ``'RUNNING'`` (the claim and lease indexes lead with
  ``status``); finished jobs are never read;
- runs in the last minute read the ``finished_at`` index from ``now - 60 s``;
- dead letters read the ``created_at`` index from ``now - 1 day``;
- breakers and buckets read ``TaskState`` (one row per flow-controlled task);
- live workers are the distinct ``worker_id`` of RUNNING jobs under a live
  lease (a worker with nothing running holds no lease and is not seen).
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from .. import registry
from ..flow import redis_buckets
from ..flow.hold_reasons import flow_view
from ..flow.rules import live_lease
from ..models import DeadLetter, Job, TaskState
from . import edge_runs
from .periodic import schedule_rows
from .running_progress import progress_lines, progress_rows
from .status_tasks import edge_lines, edge_rows, per_key_lines, per_key_rows
from .text_width import cut_dotted, cut_end, cut_middle, display_width, pad, printable

#: Open windows listed, busiest (most calls) first.
TOP_WINDOWS = 5
#: The most open windows ``debounce_status --top`` lists (decision 164): one screenful is
#: a few dozen; a larger number is a typo, and past a bigint a driver's error.
MAX_TOP_WINDOWS = 10_000
#: Flow-control rows (``TaskState``, one per flow-controlled task) read at most.
MAX_STATES = 1000
#: Rows of each list the text view draws at most (``--format json`` has them all).
MAX_ROWS = 10
#: "Runs in the last minute": jobs that finished a run (SUCCESSFUL or FAILED) this recently.
RUNS_WINDOW = timedelta(minutes=1)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _seconds(delta: timedelta) -> float:
    return round(delta.total_seconds(), 3)


def collect_status(
    *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS, top: int = TOP_WINDOWS
) -> dict[str, Any]:
    """Return a snapshot of the queues at ``now`` as JSON-ready data (issue #11, item 2).

    Args:
        now: the instant counted from (default ``timezone.now()``, §4.7).
        using: database alias.
        top: how many open windows to list, busiest first.

    Returns:
        ``{"now", "queues", "windows", "dead_letters", "breakers", "buckets",
        "per_key", "edges", "workers", "progress", "schedules"}``: ``queues`` is a list of
        ``{"queue", "ready", "due",
        "running", "oldest_due_age" (seconds or None), "runs_last_minute"}``;
        ``windows`` of ``{"id", "task_name", "key", "queue", "calls" (the
        job's ``enqueue_count``), "opened_at", "deadline", "max_run_at"}``;
        ``dead_letters`` ``{"last_hour": {kind: n}, "last_day": {kind: n}}``;
        ``breakers`` of ``{"task_name", "state", "failures", "opened_at",
        "reset_due_at"}`` (not closed); ``buckets`` of ``{"task_name",
        "tokens", "capacity", "next_token_at"}`` holding less than one token;
        ``per_key`` of ``{"task_name", "rate_limit_per_key", "on_excess", "keys_in_use",
        "keys_waiting"}`` per task with a rate limit per key (counts, never keys; decision 189);
        ``edges`` of ``{"task_name", "edge", "debounce", "max_wait"}`` (seconds) per task
        whose ``debounce_edge`` is ``"leading"`` or ``"both"`` (decision 197), and each
        window's ``"edge"``, its run of the burst (``"leading"``, ``"trailing"`` or ``None``,
        ``django_debounce.ops.edge_runs.run_edge``);
        ``workers`` of ``{"worker_id", "running", "lease_expires_at"}``;
        ``progress`` the running jobs that reported progress (``running_progress``, 202);
        ``schedules`` the periodic schedules this process registered
        (:func:`~django_debounce.ops.periodic.schedule_rows`: next and last tick).
        Datetimes are ISO 8601 strings.
    """
    now = now or timezone.now()
    jobs = Job.objects.using(using).order_by()
    queues: dict[str, dict[str, Any]] = {}

    def row(queue: str) -> dict[str, Any]:
        return queues.setdefault(
            queue,
            {
                "queue": queue,
                "ready": 0,
                "due": 0,
                "running": 0,
                "oldest_due_age": None,
                "runs_last_minute": 0,
            },
        )

    for item in jobs.ready().values("queue").annotate(n=Count("pk")):
        row(item["queue"])["ready"] = item["n"]
    for item in jobs.due(now).values("queue").annotate(n=Count("pk"), oldest=Min("run_at")):
        row(item["queue"]).update(due=item["n"], oldest_due_age=_seconds(now - item["oldest"]))
    for item in jobs.running().values("queue").annotate(n=Count("pk")):
        row(item["queue"])["running"] = item["n"]
    recent = jobs.filter(
        finished_at__gte=now - RUNS_WINDOW,
        finished_at__lte=now,
        status__in=[Job.Status.SUCCESSFUL, Job.Status.FAILED],
    )
    for item in recent.values("queue").annotate(n=Count("pk")):
        row(item["queue"])["runs_last_minute"] = item["n"]
    return {
        "now": _iso(now),
        "queues": [queues[name] for name in sorted(queues)],
        "windows": _windows(jobs, top),
        "dead_letters": _dead_letters(now, using),
        **_flow_control(now, using),
        "edges": edge_rows(),
        "workers": _workers(jobs, now),
        "progress": progress_rows(jobs),
        "schedules": schedule_rows(now=now, using=using),
    }


def _windows(jobs: Any, top: int) -> list[dict[str, Any]]:
    windows = edge_runs.with_run_edges(jobs.open_windows()).order_by(
        "-enqueue_count", "run_at", "id"
    )
    windows = windows[:top]
    return [
        {
            "id": job.pk,
            "task_name": job.task_name,
            "key": job.debounce_key,
            "queue": job.queue,
            "calls": job.enqueue_count,
            "opened_at": _iso(job.opened_at),
            "deadline": _iso(job.run_at),
            "max_run_at": _iso(job.max_run_at),
            "edge": edge_runs.run_edge(job),
        }
        for job in windows.only(
            "task_name",
            "debounce_key",
            "queue",
            "enqueue_count",
            "opened_at",
            "run_at",
            "max_run_at",
            "key_hash",
        )
    ]


def _dead_letters(now: datetime, using: str) -> dict[str, dict[str, int]]:
    hour = Count("pk", filter=Q(created_at__gte=now - timedelta(hours=1)))
    rows = (
        DeadLetter.objects.using(using)
        .filter(created_at__gte=now - timedelta(days=1), created_at__lte=now)
        .order_by()
        .values("kind")
        .annotate(day=Count("pk"), hour=hour)
    )
    result: dict[str, dict[str, int]] = {"last_hour": {}, "last_day": {}}
    for item in sorted(rows, key=lambda r: r["kind"]):
        result["last_day"][item["kind"]] = item["day"]
        if item["hour"]:
            result["last_hour"][item["kind"]] = item["hour"]
    return result


def _flow_control(now: datetime, using: str) -> dict[str, list[dict[str, Any]]]:
    """Open breakers and buckets holding less than a token, by task name.

    Buckets are read like the admin's (:func:`~django_debounce.flow.hold_reasons.flow_view`): with
    ``DEBOUNCE_REDIS`` a rate-limited task registered here has its bucket in
    Redis and maybe no ``TaskState`` row, so every such task is read from
    Redis; while Redis does not answer, the database bucket is shown, as the
    claim then uses it (decisions 104, 139).
    """
    breakers, buckets = [], []
    states = TaskState.objects.using(using).filter(
        ~Q(breaker_state=TaskState.BreakerState.CLOSED) | Q(tokens__isnull=False)
    )
    found = {state.task_name: state for state in states.order_by("task_name")[:MAX_STATES]}
    names = set(found)
    if redis_buckets.store() is not None:
        names |= {name for name, task in registry.all_tasks().items() if task.options.rate_limit}
    for name in sorted(names)[:MAX_STATES]:
        state = found.get(name)
        view = flow_view(name, state, now=now)
        if state is not None and state.breaker_state != TaskState.BreakerState.CLOSED:
            breakers.append(
                {
                    "task_name": name,
                    "state": state.breaker_state,
                    "failures": state.failures,
                    "opened_at": _iso(state.opened_at),
                    "reset_due_at": _iso(view.reset_due_at),
                }
            )
        if view.tokens is not None and view.capacity is not None and view.tokens < 1:
            buckets.append(
                {
                    "task_name": name,
                    "tokens": round(view.tokens, 3),
                    "capacity": view.capacity,
                    "next_token_at": _iso(view.next_token_at),
                }
            )
    return {"breakers": breakers, "buckets": buckets, "per_key": per_key_rows(now, using)}


def _workers(jobs: Any, now: datetime) -> list[dict[str, Any]]:
    rows = (
        jobs.filter(live_lease(now))
        .values("worker_id")
        .annotate(running=Count("pk"), lease=Max("lease_expires_at"))
        .order_by("worker_id")
    )
    return [
        {"worker_id": r["worker_id"], "running": r["running"], "lease_expires_at": _iso(r["lease"])}
        for r in rows
    ]


def _age(seconds: float | None) -> str:
    """``"3m07s"``-style text of a number of seconds; ``"-"`` for None."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _until(moment: str | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = (datetime.fromisoformat(moment) - now).total_seconds()
    return ("in " + _age(seconds)) if seconds >= 0 else (_age(-seconds) + " ago")


#: Widest text view: on a wider terminal the extra columns go to names, up to this.
MAX_WIDTH = 160
#: Narrowest text view (a narrower terminal wraps lines).
MIN_WIDTH = 60
#: The lease column of a live-worker row ("in 59m59s", "1d02h ago").
LEASE_W = 11


def screen_size(tty: bool) -> tuple[int, int | None]:
    """Return ``(width, height)`` for the text view: the terminal's on a terminal.

    Args:
        tty: whether the output stream is a terminal.

    Returns:
        Off a terminal ``(80, None)`` (no height limit), or ``COLUMNS`` held to
        60..160 when set. On one, the width of
        :func:`shutil.get_terminal_size` held to 60..160 columns, and its
        number of lines (decision 132).
    """
    if not tty:  # a pipe or a file: COLUMNS if the caller set it, as shutil reads it
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() else 80
        return max(MIN_WIDTH, min(width, MAX_WIDTH)), None
    size = shutil.get_terminal_size((80, 24))
    return max(MIN_WIDTH, min(size.columns, MAX_WIDTH)), max(size.lines, 10)


Section = tuple[list[str], list[str], int]


def _fit(sections: list[Section], height: int | None) -> list[int]:
    """How many rows of each section to draw so the view takes at most ``height`` lines.

    A section is ``(heading lines, row lines, rows in all)``; rows not drawn
    cost one "… and N more" line. The longest list gives a row back first.
    """
    shown = [min(len(rows), MAX_ROWS) for _, rows, _ in sections]

    def lines() -> int:
        return sum(
            len(head) + n + (n < total) for n, (head, _, total) in zip(shown, sections, strict=True)
        )

    while height is not None and lines() > height and any(shown):
        shown[shown.index(max(shown))] -= 1
    return shown


def render_status(snapshot: dict[str, Any], *, width: int = 80, height: int | None = None) -> str:
    """Draw :func:`collect_status`'s snapshot as text, no line wider than ``width`` (>= 60).

    Args:
        snapshot: what :func:`collect_status` returned.
        width: terminal columns (display width: a CJK character takes two).
        height: lines available (``--watch`` on a terminal) or None: each
            list is then drawn shorter, longest first, so the heading stays
            on screen.

    Lists longer than :data:`MAX_ROWS` (or than ``height`` allows) end with
    a "… and N more" line. Long names are shortened where they differ: keys,
    queues and worker ids in the middle, dotted task paths keeping the
    function name; a worker's lease time is always whole (decision 132).
    """
    now = datetime.fromisoformat(snapshot["now"])
    name_w = width - 53
    queues = [
        f"{pad(cut_middle(q['queue'], name_w), name_w)} {q['ready']:>9,} {q['due']:>9,}"
        f" {q['running']:>9,} {_age(q['oldest_due_age']):>11} {q['runs_last_minute']:>9,}"
        for q in snapshot["queues"]
    ]
    key_w = width - 38
    task_w = key_w // 3
    windows = []
    for w in snapshot["windows"]:
        task = cut_dotted(w["task_name"], task_w).rsplit(".", 1)[-1]
        label = f"{task} {cut_middle(w['key'] or '', key_w - display_width(task) - 1)}"
        forced = " max" if w["deadline"] == w["max_run_at"] else ""
        lead = " lead" if w.get("edge") == edge_runs.LEADING else ""
        windows.append(
            f"  #{w['id']:<9} {pad(label, key_w)} {w['calls']:>7,}"
            f" {_until(w['deadline'], now):>11}{forced}{lead}"
        )
    letters = snapshot["dead_letters"]
    kinds = sorted(letters["last_day"])
    dead = [
        f"  {pad(cut_middle(kind, 14), 14)} {letters['last_hour'].get(kind, 0):>9,}"
        f" {letters['last_day'][kind]:>10,}"
        for kind in kinds
    ]
    task_col = width - 36
    breakers = [
        f"  {pad(cut_dotted(b['task_name'], task_col), task_col)} {b['state']:<9}"
        f" probe {_until(b['reset_due_at'], now)}"
        for b in snapshot["breakers"]
    ]
    buckets = [
        f"  {pad(cut_dotted(b['task_name'], task_col), task_col)}"
        f" {b['tokens']:>5.2f}/{b['capacity']:<4} next {_until(b['next_token_at'], now)}"
        for b in snapshot["buckets"]
    ]
    per_key = per_key_lines(snapshot.get("per_key", []), task_col - 4)  # its counts take 40
    edges = edge_lines(snapshot.get("edges", []), task_col)
    worker_w = width - 23 - LEASE_W  # "  ", " 1234 running, lease ", the lease
    workers = [
        f"  {pad(cut_middle(w['worker_id'], worker_w), worker_w)} {w['running']:>4}"
        f" running, lease {_until(w['lease_expires_at'], now)}"
        for w in snapshot["workers"]
    ]
    # The name takes what the cron, its zone, two times (up to 10 characters each) and the
    # outcome leave.
    schedule_w = max(10, width - 74)
    schedules = [
        f"  {pad(cut_middle(p['name'], schedule_w), schedule_w)} {p['cron']:<13}"
        f" {pad(cut_middle(p['tz'], 14), 14)}"
        f" next {_until(p['next_tick'], now)}, last {_until(p['last_tick'], now)}"
        f" {p['last_outcome'] or ''}"
        for p in snapshot.get("schedules", ())
    ]
    parts: list[tuple[list[str], list[str], str]] = [
        (
            [
                f"django-debounce status at {now:%Y-%m-%d %H:%M:%S %Z}",
                "",
                f"{'queue':<{name_w}} {'ready':>9} {'due':>9} {'running':>9}"
                f" {'oldest due':>11} {'runs/min':>9}",
            ],
            queues,
            "(no READY or RUNNING jobs, no runs in the last minute)",
        ),
        (["", "busiest open windows (calls so far, deadline)"], windows, "(none open)"),
        (["", "dead letters     last hour   last day"], dead, "(none in the last day)"),
        (["", f"open circuit breakers: {len(breakers)}"], breakers, ""),
        (["", f"exhausted token buckets: {len(buckets)}"], buckets, ""),
        (["", f"live workers (RUNNING jobs under a live lease): {len(workers)}"], workers, ""),
    ]
    if per_key:  # only where a task has rate_limit_per_key (decision 189)
        parts.insert(-1, (["", "rate limits per key (keys in use, waiting)"], per_key, ""))
    # Only where a task has a leading or both edge (decision 197), and not in a view of
    # limited height (--watch on a terminal): it is configuration, not live state, and its
    # lines would cost the queues theirs.
    if edges and height is None:
        parts.insert(-1, (["", "edges other than trailing (window, max wait)"], edges, ""))
    if progress := progress_lines(snapshot.get("progress", []), width=width):  # decision 202
        parts.append((["", "running jobs with progress"], progress, ""))
    if schedules:  # only where periodic tasks are declared (decision 177)
        parts.append((["", "periodic schedules (cron, zone, next tick, last tick)"], schedules, ""))
    # An empty list's "(none …)" line belongs to its heading: never traded for "… more".
    sections: list[Section] = [
        (head + ([f"  {empty}"] if empty and not rows else []), rows, len(rows))
        for head, rows, empty in parts
    ]
    out: list[str] = []
    for (head, rows, total), n in zip(sections, _fit(sections, height), strict=True):
        out += head + rows[:n]
        if n < total:
            more = " (--format json lists all)" if n >= MAX_ROWS else ""
            out.append(f"  … and {total - n} more{more}")
    # Data (keys, names, notes) is shown escaped where a terminal would act on it.
    return "\n".join(cut_end(printable(text), width) for text in out)
