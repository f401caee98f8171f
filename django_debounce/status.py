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

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from . import redis_buckets, registry
from .claim_rules import live_lease
from .hold_reasons import flow_view
from .models import DeadLetter, Job, TaskState

#: Open windows listed, busiest (most calls) first.
TOP_WINDOWS = 5
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
        "workers"}``: ``queues`` is a list of ``{"queue", "ready", "due",
        "running", "oldest_due_age" (seconds or None), "runs_last_minute"}``;
        ``windows`` of ``{"id", "task_name", "key", "queue", "calls" (the
        job's ``enqueue_count``), "opened_at", "deadline", "max_run_at"}``;
        ``dead_letters`` ``{"last_hour": {kind: n}, "last_day": {kind: n}}``;
        ``breakers`` of ``{"task_name", "state", "failures", "opened_at",
        "reset_due_at"}`` (not closed); ``buckets`` of ``{"task_name",
        "tokens", "capacity", "next_token_at"}`` holding less than one token;
        ``workers`` of ``{"worker_id", "running", "lease_expires_at"}``.
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
        "workers": _workers(jobs, now),
    }


def _windows(jobs: Any, top: int) -> list[dict[str, Any]]:
    windows = jobs.open_windows().order_by("-enqueue_count", "run_at", "id")[:top]
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
        }
        for job in windows.only(
            "task_name",
            "debounce_key",
            "queue",
            "enqueue_count",
            "opened_at",
            "run_at",
            "max_run_at",
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

    Buckets are read like the admin's (:func:`~.hold_reasons.flow_view`): with
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
    return {"breakers": breakers, "buckets": buckets}


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


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_status(snapshot: dict[str, Any], *, width: int = 80) -> str:
    """Draw :func:`collect_status`'s snapshot as text, no line longer than ``width`` (>= 60).

    Lists longer than :data:`MAX_ROWS` end with a "… and N more" line.
    """
    now = datetime.fromisoformat(snapshot["now"])
    name_w = max(12, width - 60)
    out = [f"django-debounce status at {now:%Y-%m-%d %H:%M:%S %Z}", ""]
    out.append(
        f"{'queue':<{name_w}} {'ready':>9} {'due':>9} {'running':>9} {'oldest due':>11}"
        f" {'runs/min':>9}"
    )
    for q in snapshot["queues"] or [None]:
        if q is None:
            out.append("  (no READY or RUNNING jobs, no runs in the last minute)")
            continue
        out.append(
            f"{_cut(q['queue'], name_w):<{name_w}} {q['ready']:>9,} {q['due']:>9,}"
            f" {q['running']:>9,} {_age(q['oldest_due_age']):>11} {q['runs_last_minute']:>9,}"
        )
    out += ["", "busiest open windows (calls so far, deadline)"]
    key_w = width - 38
    for w in snapshot["windows"] or [None]:
        if w is None:
            out.append("  (none open)")
            continue
        label = _cut(f"{w['task_name'].rsplit('.', 1)[-1]} {w['key']}", key_w)
        forced = " max" if w["deadline"] == w["max_run_at"] else ""
        out.append(
            f"  #{w['id']:<9} {label:<{key_w}} {w['calls']:>7,} {_until(w['deadline'], now):>11}"
            f"{forced}"
        )
    letters = snapshot["dead_letters"]
    kinds = sorted(set(letters["last_day"]))
    out += ["", "dead letters     last hour   last day"]
    for kind in kinds or [None]:
        if kind is None:
            out.append("  (none in the last day)")
            continue
        out.append(
            f"  {kind:<14} {letters['last_hour'].get(kind, 0):>9,} {letters['last_day'][kind]:>10,}"
        )
    sections: tuple[tuple[str, list[dict[str, Any]], Callable[[dict[str, Any]], str]], ...] = (
        (
            "open circuit breakers",
            snapshot["breakers"],
            lambda b: (
                f"  {_cut(b['task_name'], width - 36):<{width - 36}} {b['state']:<9}"
                f" probe {_until(b['reset_due_at'], now)}"
            ),
        ),
        (
            "exhausted token buckets",
            snapshot["buckets"],
            lambda b: (
                f"  {_cut(b['task_name'], width - 36):<{width - 36}}"
                f" {b['tokens']:>5.2f}/{b['capacity']:<4} next {_until(b['next_token_at'], now)}"
            ),
        ),
        (
            "live workers (RUNNING jobs under a live lease)",
            snapshot["workers"],
            lambda w: (
                f"  {_cut(w['worker_id'], width - 30):<{width - 30}} {w['running']:>4}"
                f" running, lease {_until(w['lease_expires_at'], now)}"
            ),
        ),
    )
    for title, rows, line in sections:
        out += ["", f"{title}: {len(rows)}"]
        out += [_cut(line(r), width) for r in rows[:MAX_ROWS]]
        if len(rows) > MAX_ROWS:
            out.append(f"  … and {len(rows) - MAX_ROWS} more (--format json lists all)")
    return "\n".join(_cut(text, width) for text in out)
