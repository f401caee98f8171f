"""Checks on real rows for the rate-accuracy and soak tests (issue #18 items 3 and 4).

The state machine (``tests/statemachine``) judges every start against an
in-process model; these functions judge what real worker processes left in
the database: start instants, run intervals, windows and dead letters.
Everything here is pure (lists of instants in, numbers or messages out)
except :func:`open_windows_per_key`, which reads the job table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Float noise forgiven by the rate rule (the buckets' own EPSILON).
EPSILON = 1e-9


@dataclass(frozen=True)
class RateBreach:
    """The worst interval of starts against a bucket: ``count`` starts in ``[first, last]``."""

    count: int
    allowed: float
    first: datetime
    last: datetime

    @property
    def excess(self) -> float:
        return self.count - self.allowed

    def __str__(self) -> str:
        span = (self.last - self.first).total_seconds()
        return (
            f"{self.count} starts in [{self.first.isoformat()}, {self.last.isoformat()}] "
            f"({span:.6f} s), the bucket allows {self.allowed:.3f}"
        )


def worst_rate_interval(
    starts: Sequence[datetime], capacity: float, per_second: float
) -> RateBreach | None:
    """Return the interval whose start count exceeds the bucket the most, or the tightest one.

    The rule of ``tests/statemachine/model.py`` (``Model.hand_over``): for any two
    starts ``a <= b``, the starts in ``[a, b]`` are at most
    ``capacity + per_second * (b - a)``. With ``f(k) = k - per_second * t_k``
    over the sorted starts, the count in ``[t_i, t_j]`` minus the allowance is
    ``f(j) - f(i) + 1 - capacity``: one pass keeping the smallest ``f(i)``.
    Returns ``None`` for no starts; else the worst interval (``excess > EPSILON``:
    a breach).
    """
    ordered = sorted(starts)
    if not ordered:
        return None
    base = ordered[0]
    best: tuple[float, int, int] | None = None
    low_i, low_f = 0, 0.0
    for j, when in enumerate(ordered):
        f_j = j - per_second * (when - base).total_seconds()
        if f_j < low_f:
            low_i, low_f = j, f_j
        excess = f_j - low_f + 1 - capacity
        if best is None or excess > best[0]:
            best = (excess, low_i, j)
    assert best is not None
    _, i, j = best
    span = (ordered[j] - ordered[i]).total_seconds()
    return RateBreach(j - i + 1, capacity + per_second * span, ordered[i], ordered[j])


def most_in_window(instants: Sequence[datetime], seconds: float) -> int:
    """The most instants any closed window ``[t, t + seconds]`` holds (``t`` one of them)."""
    ordered = sorted(instants)
    best = j = 0
    for i, first in enumerate(ordered):
        while j < len(ordered) and (ordered[j] - first).total_seconds() <= seconds:
            j += 1
        best = max(best, j - i)
    return best


def count_between(instants: Sequence[datetime], first: datetime, last: datetime) -> int:
    """How many instants fall in the half-open ``(first, last]``."""
    return sum(1 for t in instants if first < t <= last)


def wasted_refill(
    starts: Sequence[datetime],
    capacity: float,
    per_second: float,
    *,
    since: datetime,
    until: datetime,
) -> float:
    """Tokens the bucket lost to its cap between ``since`` and ``until``, replayed from ``starts``.

    The bucket is replayed from full at the first start, each start taking one
    token at its instant. Refill that arrives while the bucket is full is lost:
    with jobs due all along, each lost token is a run that could have started
    and did not (no claim came while a token was there).
    """
    times = sorted(t.timestamp() for t in starts)
    lo_bound, hi_bound = since.timestamp(), until.timestamp()
    if not times:
        return max(0.0, hi_bound - lo_bound) * per_second
    level, prev, lost = float(capacity) - 1, times[0], 0.0
    for index, when in enumerate([*times[1:], hi_bound]):
        full_at = prev + max(0.0, capacity - level) / per_second
        lo, hi = max(full_at, lo_bound), min(when, hi_bound)
        if hi > lo:
            lost += (hi - lo) * per_second
        level = min(float(capacity), level + max(0.0, when - prev) * per_second)
        if index < len(times) - 1:  # a start takes a token; ``until`` does not
            level = max(0.0, level - 1)
        prev = when
    return lost


def most_overlapping(intervals: Sequence[tuple[datetime, datetime]]) -> int:
    """The most intervals that overlap at one instant (an end at ``t`` before a start at ``t``)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = best = 0
    for _, delta in events:
        running += delta
        best = max(best, running)
    return best


def overlapping_runs(
    runs: Sequence[tuple[str, datetime, datetime, int]],
) -> list[tuple[str, int, int]]:
    """Return ``(key, job id, job id)`` for each two runs of one key that overlap in time.

    ``runs``: ``(key, started, finished, job id)``. Consecutive runs of a key
    (sorted by start) are compared: one starting before the previous ended overlaps.
    """
    by_key: dict[str, list[tuple[datetime, datetime, int]]] = {}
    for key, started, finished, job_id in runs:
        by_key.setdefault(key, []).append((started, finished, job_id))
    found = []
    for key, items in by_key.items():
        items.sort()
        latest_end, latest_job = items[0][1], items[0][2]
        for started, finished, job_id in items[1:]:
            if started < latest_end:
                found.append((key, latest_job, job_id))
            if finished > latest_end:
                latest_end, latest_job = finished, job_id
    return found


def open_windows_per_key() -> list[tuple[str, str, int]]:
    """Return ``(task, key, count)`` for each (task, debounce key) with more than one open window."""
    from django_debounce.models import Job

    counts = Counter(
        Job.objects.filter(status=Job.Status.READY, window_key__isnull=False).values_list(
            "task_name", "debounce_key"
        )
    )
    return [(task, key, n) for (task, key), n in counts.items() if n > 1]


def rss_kib(pid: int) -> int:
    """The resident set size of process ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def run_queue_wait(pid: int) -> tuple[float, int]:
    """Return (seconds waited for a CPU, times scheduled) of the main thread of process ``pid``.

    The second and third fields of ``/proc/<pid>/task/<pid>/schedstat`` (since
    the thread started): time spent runnable but waiting on a run queue, and
    how many times the thread got a CPU. For a worker the main thread is its
    claim loop: when each of its wake-ups waits long for a CPU, claims come late
    because the machine has no CPU for it, whatever the package does.
    """
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        _, waited, slices = stat.read().split()[:3]
    return int(waited) / 1e9, int(slices)


def bucket_dry_at(starts: Sequence[datetime], capacity: float, per_second: float) -> datetime:
    """The first start after which the bucket, replayed from full, holds no whole token.

    From then on every start was paid by refill: the steady part of a run.
    """
    ordered = sorted(starts)
    level, prev = float(capacity), ordered[0]
    for when in ordered:
        level = min(float(capacity), level + (when - prev).total_seconds() * per_second) - 1
        prev = when
        if level < 1 - EPSILON:
            return when
    return ordered[-1]


# -- the soak's accounting --------------------------------------------------------------------

#: Kinds whose runs of one key must never overlap (debounced tasks, §4.5).
KEYED = ("debounced", "merged", "bulk")


@dataclass
class Rows:
    """What the soak left, read once after the drain.

    ``jobs``: id -> ``{"task", "status", "args", "count", "attempts", "started_at",
    "expires_at"}``; ``runs``: CallLog rows as ``{"task", "key", "ids", "job_id", "attempt",
    "started", "finished"}``; ``letters``: job id -> dead-letter reason (``None``: pruned job).
    """

    jobs: dict[int, dict[str, Any]]
    runs: list[dict[str, Any]]
    letters: dict[int | None, list[str]]


def account(calls: Sequence[dict[str, Any]], rows: Rows, failing_runs: int) -> list[str]:
    """Return every way the rows break the contract for these producer ``calls`` (empty: none).

    Every call that did not raise is accounted for by its kind: a run that
    served it (debounced: the job it joined ran once; merged and bulk: its
    item is in exactly one run's payload, of the job the call returned), or a
    planned end (an expired job never ran; a shed job has a ``shed:`` dead
    letter; a job failing every run has a dead letter after ``failing_runs``
    runs). Every job and dead letter is some call's; no job is left READY or
    RUNNING; a job ran as many times as its attempts say.
    """
    problems: list[str] = []
    runs_of: dict[int, list[dict[str, Any]]] = {}
    for run in rows.runs:
        runs_of.setdefault(run["job_id"], []).append(run)
    served: dict[tuple[str, str], list[int]] = {}  # (task, item) -> job ids of the runs
    for run in rows.runs:
        for item in run["ids"]:
            served.setdefault((run["task"], item), []).append(run["job_id"])
    made = [call for call in calls if "error" not in call]
    called_jobs = {call["job_id"] for call in made}
    for pk, job in rows.jobs.items():
        ran = len(runs_of.get(pk, []))
        if pk not in called_jobs:
            problems.append(f"job #{pk} ({job['task']}) is no call's")
        if job["status"] in ("READY", "RUNNING"):
            problems.append(f"job #{pk} ({job['task']}) left {job['status']} after the drain")
        if ran != job["attempts"]:
            problems.append(
                f"job #{pk} ({job['task']}) ran {ran} times, attempts {job['attempts']}"
            )
    counted: Counter[int] = Counter()
    for call in made:
        kind, item, pk = call["kind"], call["item"], call["job_id"]
        task = f"soak.{kind}"
        job = rows.jobs.get(pk)
        if job is None:
            problems.append(f"{kind} call {item}: its job #{pk} is gone")
            continue
        counted[pk] += 1
        status, ran = job["status"], len(runs_of.get(pk, []))
        letters = rows.letters.get(pk, [])
        if kind in ("merged", "bulk"):
            where = served.get((task, item), [])
            if where != [pk] or status != "SUCCESSFUL":
                problems.append(f"{kind} item {item} of job #{pk} ({status}) ran in {where}")
        elif kind == "expiring" and status == "EXPIRED":
            if ran or letters:
                problems.append(f"expired job #{pk} ran {ran} times, letters {letters}")
        elif kind == "expiring" and status == "SUCCESSFUL":
            if ran != 1 or not job["started_at"] < job["expires_at"]:
                problems.append(f"expiring job #{pk} ran {ran} times, started past its expiry")
        elif kind == "dropped" and status == "SHED":
            if ran or len(letters) != 1 or not letters[0].startswith("shed:"):
                problems.append(f"shed job #{pk} ran {ran} times, letters {letters}")
        elif kind == "failing" and call["fail_runs"] >= failing_runs:
            if status != "FAILED" or ran != failing_runs or len(letters) != 1:
                problems.append(f"failing job #{pk}: {status}, {ran} runs, letters {letters}")
        elif kind == "failing":
            if status != "SUCCESSFUL" or ran != call["fail_runs"] + 1 or letters:
                problems.append(f"flaky job #{pk}: {status}, {ran} runs, letters {letters}")
        elif status != "SUCCESSFUL" or ran != 1 or letters:
            problems.append(f"{kind} call {item}: job #{pk} {status}, {ran} runs, {letters}")
    for pk, job in rows.jobs.items():
        if job["task"] in ("soak.debounced", "soak.merged", "soak.bulk"):
            if counted[pk] != job["count"]:
                problems.append(f"job #{pk} counts {job['count']} calls, {counted[pk]} were made")
        elif counted[pk] != 1:
            problems.append(f"job #{pk} ({job['task']}) returned to {counted[pk]} calls")
    ended = {pk for pk, job in rows.jobs.items() if job["status"] in ("FAILED", "SHED")}
    if set(rows.letters) != ended:
        problems.append(f"dead letters of {sorted(set(rows.letters) ^ ended)[:20]} don't match")
    for (task, item), where in served.items():
        if len(where) != 1 and task in ("soak.merged", "soak.bulk"):
            problems.append(f"{task} item {item} ran {len(where)} times: jobs {where}")
    return problems


def keyed_overlaps(runs: Sequence[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """Runs of one debounce key (per task) that overlap in time (§4.5)."""
    return overlapping_runs(
        [
            (f"{run['task']}|{run['key']}", run["started"], run["finished"], run["job_id"])
            for run in runs
            if run["task"] in tuple(f"soak.{kind}" for kind in KEYED)
        ]
    )
