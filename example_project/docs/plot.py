"""``replay_events --plot FILE.png``: a picture of what debouncing did (issue #11, item 5).

Drawn from a virtual replay (job times are trace times there) with
matplotlib, the ``plot`` extra (``pip install django-debounce[plot]``):

* top: the busiest folders' timelines over the busiest stretch of the trace.
  Each call is a tick; each window is a bar from the moment it opened to the
  moment its job ran; a run forced by the max wait ends in a red triangle,
  a run after a quiet window in a dot;
* bottom: "what debouncing saved", calls and runs per hour over that stretch.

Only :class:`matplotlib.figure.Figure` and its Agg canvas are used (no
``pyplot``): no global state, no display needed.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db.models import F

from django_debounce.models import Job

from .events import Event
from .tasks import rebuild_docs

#: Pixel size of the picture: ``FIGSIZE`` inches at ``DPI``.
FIGSIZE = (12.0, 8.0)
DPI = 100
HOUR = 3600.0


class PlotError(RuntimeError):
    """The picture cannot be drawn (matplotlib missing, nothing replayed)."""


@dataclass
class PlotInfo:
    """What the picture shows (for the command's summary line and the tests)."""

    start: datetime
    end: datetime
    keys: list[str]
    calls: int
    """Calls (events) in the stretch, every folder."""
    runs: int
    """Runs started in the stretch, every folder."""
    size: tuple[int, int]
    """Width and height in pixels."""


def busiest_span(times: Sequence[float], span: float) -> tuple[float, float]:
    """Return ``(start, start + span)`` holding the most of ``times`` (sorted Unix seconds)."""
    best, best_start, first = -1, times[0], 0
    for last, end_time in enumerate(times):
        while times[first] < end_time - span:
            first += 1
        if last - first + 1 > best:
            best, best_start = last - first + 1, times[first]
    return best_start, best_start + span


def _stretch(times: Sequence[float], span: float) -> tuple[float, float]:
    """Return the stretch to draw: the most runs forced by the max wait, else the most calls.

    Forced runs are where debouncing is busiest (calls kept coming for a whole max wait),
    so that stretch shows windows sliding to their ceiling; a stream without any falls
    back to the stretch with the most calls. The stretch starts an hour before its first
    forced window opened, so the calls that led to it are in view.
    """
    forced = sorted(
        _stamp(opened)
        for opened in Job.objects.filter(
            task_name=rebuild_docs.name, status=Job.Status.SUCCESSFUL, run_at=F("max_run_at")
        ).values_list("opened_at", flat=True)
        if opened is not None
    )
    if not forced:
        return busiest_span(times, span)
    start = busiest_span(forced, span - HOUR)[0] - HOUR
    return start, start + span


def _stamp(value: datetime) -> float:
    return value.timestamp()


def load_matplotlib() -> Any:
    """Return matplotlib's ``dates`` module, Agg canvas and ``Figure``; PlotError without it."""
    try:
        from matplotlib import dates
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotError(
            "--plot needs matplotlib: pip install 'django-debounce[plot]' (or matplotlib)."
        ) from exc
    return dates, FigureCanvasAgg, Figure


def check_target(path: Path) -> None:
    """Refuse a ``--plot`` path that :func:`draw` could not write, before the replay runs.

    The file's directory must exist and be writable, and its extension name
    a format matplotlib writes (``png``, ``svg``, ``pdf``, ``jpg``, ``webp``, ...:
    ``FigureCanvasAgg.get_supported_filetypes()``; ``savefig`` picks the
    format from the extension).

    Raises:
        PlotError: matplotlib is missing, or the path fails one of the above.
    """
    _, canvas_class, figure_class = load_matplotlib()
    formats = canvas_class(figure_class()).get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        shown = ", ".join(sorted(formats))
        raise PlotError(
            f"{'no' if not suffix else f'.{suffix} is not an'} image extension matplotlib "
            f"writes; end the file name in one of: {shown}"
        )
    folder = path.parent
    if not folder.is_dir():
        raise PlotError(f"directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PlotError(f"directory {str(folder)!r} is not writable")


def draw(
    events: Sequence[Event], path: Path, *, keys: int = 8, span_hours: float = 24.0
) -> PlotInfo:
    """Draw the picture of the replay just run into ``path`` (PNG, SVG, PDF: its extension).

    Args:
        events: the replayed events, in time order.
        path: the image to write (:func:`check_target` vets it first).
        keys: how many folders get a timeline (the busiest in the stretch).
        span_hours: length of the stretch shown (see :func:`_stretch`).

    Raises:
        PlotError: matplotlib is not installed, or there is nothing to draw.
    """
    dates, canvas_class, figure_class = load_matplotlib()
    if not events:
        raise PlotError("no events to draw")
    times = [e.timestamp for e in events]
    start, end = _stretch(times, span_hours * HOUR)
    shown = events[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)]
    # A stretch longer than the data ends an hour after its last call, not in empty space.
    end = min(end, shown[-1].timestamp + HOUR)
    per_key = Counter(e.directory for e in shown)
    top = [key for key, _ in per_key.most_common(keys)]
    runs = list(
        Job.objects.filter(
            task_name=rebuild_docs.name,
            status=Job.Status.SUCCESSFUL,
            opened_at__gte=datetime.fromtimestamp(start, UTC),
            opened_at__lte=datetime.fromtimestamp(end, UTC),
        ).values("debounce_key", "opened_at", "started_at", "run_at", "max_run_at")
    )
    if not runs:
        raise PlotError("no runs to draw: run a --virtual replay first")
    # The stretch runs on until the last of its windows has run.
    end = max(end, *(_stamp(run["started_at"]) for run in runs))

    figure = figure_class(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    canvas_class(figure)
    grid = figure.add_gridspec(2, 1, height_ratios=[3, 1.2])
    timeline, saved = figure.add_subplot(grid[0]), figure.add_subplot(grid[1])
    _timelines(timeline, dates, shown, runs, top)
    hourly_calls, hourly_runs = _per_hour(saved, dates, shown, runs, start, end)
    limits = (
        dates.date2num(datetime.fromtimestamp(start, UTC)) - 1 / 96,
        dates.date2num(datetime.fromtimestamp(end, UTC)) + 1 / 96,
    )
    for axes in (timeline, saved):
        axes.set_xlim(*limits)
        _time_axis(axes, dates, (end - start) / HOUR)
    timeline.set_title(
        f"The {len(top)} busiest folders, {datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M}"
        f" to {datetime.fromtimestamp(end, UTC):%Y-%m-%d %H:%M} UTC: each tick a call, each bar"
        " a window (opened \u2192 run)",
        fontsize=11,
        loc="left",
    )
    saved.set_title(
        f"What debouncing saved: {hourly_calls:,} calls became {hourly_runs:,} runs"
        f" ({100 * (1 - hourly_runs / hourly_calls):.0f}% fewer), every folder",
        fontsize=11,
        loc="left",
    )
    figure.savefig(path, dpi=DPI)
    width, height = (round(side * DPI) for side in FIGSIZE)
    return PlotInfo(
        start=datetime.fromtimestamp(start, UTC),
        end=datetime.fromtimestamp(end, UTC),
        keys=top,
        calls=hourly_calls,
        runs=hourly_runs,
        size=(width, height),
    )


def _timelines(
    axes: Any, dates: Any, shown: Sequence[Event], runs: list[dict[str, Any]], top: list[str]
) -> None:
    """One row per folder: call ticks, window bars, run markers."""
    row = {key: len(top) - 1 - index for index, key in enumerate(top)}  # busiest on top
    for key in top:
        ticks = [dates.date2num(e.when) for e in shown if e.directory == key]
        axes.plot(
            ticks, [row[key] + 0.28] * len(ticks), "|", color="#333333", markersize=9, mew=1.0
        )
    quiet_x, quiet_y, forced_x, forced_y = [], [], [], []
    for run in runs:
        key = (run["debounce_key"] or "").removeprefix("docs:")
        if key not in row or run["opened_at"] is None:
            continue
        opened, ran = dates.date2num(run["opened_at"]), dates.date2num(run["started_at"])
        forced = run["max_run_at"] is not None and run["run_at"] >= run["max_run_at"]
        axes.barh(
            row[key] - 0.08,
            ran - opened,
            left=opened,
            height=0.32,
            color="#d62728" if forced else "#1f77b4",
            alpha=0.35 if forced else 0.3,
            edgecolor="#d62728" if forced else "#1f77b4",
        )
        (forced_x if forced else quiet_x).append(ran)
        (forced_y if forced else quiet_y).append(row[key] - 0.08)
    axes.plot(
        quiet_x, quiet_y, "o", color="#1f77b4", markersize=4, label="run after a quiet window"
    )
    axes.plot(
        forced_x, forced_y, "v", color="#d62728", markersize=7, label="run forced by the max wait"
    )
    axes.plot([], [], "|", color="#333333", markersize=9, label="call (one changed file)")
    axes.set_yticks(range(len(top)), [_label(key) for key in reversed(top)], fontsize=9)
    axes.set_ylim(-0.7, len(top) - 0.3)
    axes.tick_params(axis="x", labelsize=9)
    axes.grid(axis="x", alpha=0.3)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=3, fontsize=9, frameon=False)


def _time_axis(axes: Any, dates: Any, hours: float) -> None:
    """Ticks on whole hours (every 1, 2, 3, 6 or 12 h: at most 10) for up to three days."""
    if hours > 72:
        locator = dates.AutoDateLocator(maxticks=10)
    else:
        step = next(step for step in (1, 2, 3, 6, 12) if hours / step <= 10)
        locator = dates.HourLocator(byhour=range(0, 24, step))
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.DateFormatter("%b %d\n%H:%M"))


def _label(key: str, width: int = 36) -> str:
    return key if len(key) <= width else "\u2026" + key[-(width - 1) :]


def _per_hour(
    axes: Any,
    dates: Any,
    shown: Sequence[Event],
    runs: list[dict[str, Any]],
    start: float,
    end: float,
) -> tuple[int, int]:
    """Calls and runs per hour over the stretch, as side-by-side bars; return the totals."""
    hours = max(1, int((end - start) // HOUR) + 1)
    calls, done = [0] * hours, [0] * hours
    for event in shown:
        calls[min(hours - 1, int((event.timestamp - start) // HOUR))] += 1
    for run in runs:
        done[min(hours - 1, int((_stamp(run["started_at"]) - start) // HOUR))] += 1
    left = [dates.date2num(datetime.fromtimestamp(start + h * HOUR, UTC)) for h in range(hours)]
    width = 1 / 24 * 0.42
    axes.bar(left, calls, width=width, align="edge", color="#7f7f7f", label="calls")
    axes.bar(
        [x + width for x in left], done, width=width, align="edge", color="#1f77b4", label="runs"
    )
    # A release commit touches hundreds of files in one hour; a log scale keeps the
    # ordinary hours (a few calls, a run or two) readable beside it.
    axes.set_yscale("log")
    axes.set_ylim(bottom=0.5)  # an hour with one call or one run still shows a bar
    axes.set_ylabel("per hour (log scale)", fontsize=9)
    axes.tick_params(labelsize=9)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(loc="upper right", fontsize=9)
    return sum(calls), sum(done)


def png_size(path: Path) -> tuple[int, int]:
    """Return ``(width, height)`` read from a PNG file's IHDR header."""
    header = path.read_bytes()[:24]
    if header[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
