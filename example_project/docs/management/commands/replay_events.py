"""``manage.py replay_events``: replay file-change events as debounced ``rebuild_docs`` calls.

Every run starts clean: it first deletes earlier ``rebuild_docs`` (and
``ping``) jobs, their dead letters and every ``DocBuild`` row, so the summary
describes this replay only. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from ... import plot
from ...events import Event, builtin_events, load_events
from ...replay import ReplayError, Summary, replay_real_time, replay_virtual, reset

#: ``--real-time`` default: the real stream (15.6 years, idle gaps cut) in about five minutes.
DEFAULT_SPEED = 100_000.0


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be greater than 0")
    return number


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


class Command(BaseCommand):
    help = (
        "Replay timestamp,author,path events as rebuild_docs(directory) enqueues, debounced "
        "per folder, and summarise the runs. Deletes earlier rebuild_docs jobs and DocBuild "
        "rows first."
    )

    summary: Summary | None = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--events",
            type=Path,
            default=None,
            help="CSV of timestamp,author,path rows (Unix seconds). Default: a built-in "
            "generated stream of 400 events.",
        )
        parser.add_argument(
            "--limit", type=positive_int, default=None, help="Replay only the first N events."
        )
        parser.add_argument(
            "--window",
            type=positive_float,
            default=3600.0,
            help="Debounce window in trace seconds (default 3600).",
        )
        parser.add_argument(
            "--max-wait",
            type=positive_float,
            default=7200.0,
            help="Max wait in trace seconds (default 7200).",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--virtual",
            dest="mode",
            action="store_const",
            const="virtual",
            help="Move a virtual clock from event to event and run due jobs with a burst "
            "worker: exact, and fast (default).",
        )
        mode.add_argument(
            "--real-time",
            dest="mode",
            action="store_const",
            const="real-time",
            help="Enqueue at trace time / --speed while a run_debounce_worker subprocess runs.",
        )
        parser.set_defaults(mode="virtual")
        parser.add_argument(
            "--speed",
            type=positive_float,
            default=DEFAULT_SPEED,
            help=f"--real-time: trace seconds per real second (default {DEFAULT_SPEED:,.0f}). "
            "The window and max wait shrink by the same factor.",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=None,
            help="--real-time: the worker's --poll-interval (default 0.01 s; 0.05 s on SQLite, "
            "where every poll takes the write lock).",
        )
        parser.add_argument(
            "--worker-concurrency",
            type=positive_int,
            default=4,
            help="--real-time: the worker's --concurrency (default 4).",
        )
        parser.add_argument(
            "--keep-idle",
            action="store_true",
            help="--real-time: replay quiet gaps in full instead of cutting each to two windows "
            "(at least the window plus 0.04 s of real time).",
        )
        parser.add_argument(
            "--no-progress", action="store_true", help="Do not show a progress bar."
        )
        parser.add_argument(
            "--plot",
            type=Path,
            default=None,
            metavar="FILE",
            help="--virtual: draw the busiest folders' timelines and calls vs runs per hour "
            "into this image: .png, .svg, .pdf or another format matplotlib writes (needs "
            "matplotlib: the 'plot' extra). Checked before the replay starts.",
        )
        parser.add_argument(
            "--plot-keys",
            type=positive_int,
            default=None,
            help="--plot: folders drawn, the busiest in the stretch shown (default 8).",
        )
        parser.add_argument(
            "--plot-hours",
            type=positive_float,
            default=None,
            help="--plot: hours shown: the stretch with the most runs forced by the max wait, else the most calls (default 24).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        window, max_wait = options["window"], options["max_wait"]
        if max_wait < window:
            raise CommandError(f"--max-wait {max_wait:g} is shorter than --window {window:g}.")
        if options["plot"] is not None and options["mode"] != "virtual":
            raise CommandError(
                "--plot draws a --virtual replay (its job times are the trace's times)."
            )
        for flag in ("plot_keys", "plot_hours"):
            if options[flag] is not None and options["plot"] is None:
                raise CommandError(f"--{flag.replace('_', '-')} shapes --plot; add --plot FILE.")
        if options["plot"] is not None:
            options["plot"] = Path(options["plot"])
            try:  # refuse before replaying (minutes), not after
                plot.check_target(options["plot"])
            except plot.PlotError as exc:
                raise CommandError(f"--plot {options['plot']}: {exc}") from None
        events = self._events(options["events"], options["limit"])
        if not events:
            raise CommandError("no events to replay")
        jobs, builds = reset()
        if jobs or builds:
            self.stdout.write(
                f"Starting clean: deleted {jobs:,} earlier job(s) and {builds:,} DocBuild row(s)."
            )
        source = options["events"] or "the built-in stream"
        mode = options["mode"]
        self.stdout.write(
            f"Replaying {len(events):,} events from {source} ({mode}; window {window:g} s, "
            f"max wait {max_wait:g} s)"
        )
        bar = self._progress(len(events), disable=options["no_progress"])
        try:
            if mode == "virtual":
                summary = replay_virtual(
                    events, window=window, max_wait=max_wait, progress=bar.update
                )
            else:
                speed = options["speed"]
                poll = options["poll_interval"]
                if poll is None:
                    poll = 0.05 if connection.vendor == "sqlite" else 0.01
                real_window = window / speed
                if real_window < 2 * poll:
                    self.stderr.write(
                        f"Note: at --speed {speed:g} the window lasts {real_window * 1000:.2f} ms "
                        f"of real time, not much longer than the worker's poll interval "
                        f"({poll * 1000:g} ms): runs will come late and "
                        "windows collapse more than in a --virtual replay."
                    )
                summary = replay_real_time(
                    events,
                    window=window,
                    max_wait=max_wait,
                    speed=speed,
                    poll_interval=poll,
                    concurrency=options["worker_concurrency"],
                    skip_idle=not options["keep_idle"],
                    progress=bar.update,
                    say=lambda text: bar.write(text),
                )
        except ReplayError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            bar.close()
        self.summary = summary
        self.stdout.write(
            self.style.SUCCESS(
                f"Replayed {summary.events:,} events in {summary.wall_seconds:.1f} s of wall-clock time ({mode})"
            )
        )
        for line in summary.lines():
            self.stdout.write(line)
        if options["plot"] is not None:
            keys, hours = options["plot_keys"] or 8, options["plot_hours"] or 24.0
            self._plot(events, options["plot"], keys, hours)

    def _plot(self, events: list[Event], path: Path, keys: int, hours: float) -> None:
        try:
            info = plot.draw(
                sorted(events, key=lambda e: e.timestamp), path, keys=keys, span_hours=hours
            )
        except (plot.PlotError, OSError) as exc:
            raise CommandError(f"--plot {path}: {exc}") from exc
        self.stdout.write(
            f"Drew {path} ({info.size[0]}x{info.size[1]} px): {len(info.keys)} folders, "
            f"{info.start:%Y-%m-%d %H:%M} to {info.end:%Y-%m-%d %H:%M} UTC, "
            f"{info.calls:,} calls, {info.runs:,} runs"
        )

    def _events(self, path: Path | None, limit: int | None) -> list[Event]:
        if path is None:
            return builtin_events(limit)
        try:
            return load_events(path, limit)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

    def _progress(self, total: int, *, disable: bool) -> Any:
        """A tqdm bar on stderr timed by the real clock (the virtual replay moves time.time)."""
        try:
            from time_machine import escape_hatch
            from tqdm import tqdm  # type: ignore[import-untyped]
        except ImportError:
            return _NoBar(self.stdout.write)

        def real_time() -> float:
            # escape_hatch.time.time() raises "Not currently time-travelling" outside a travel,
            # and the bar is drawn (and reset) before the virtual replay starts travelling.
            return escape_hatch.time.time() if escape_hatch.is_travelling() else time.time()

        bar = tqdm(total=total, unit="event", disable=disable or None, dynamic_ncols=True)
        bar._time = real_time
        bar.reset(total=total)
        return bar


class _NoBar:
    """Stands in for tqdm when it is not installed."""

    def __init__(self, write: Any) -> None:
        self.write = write

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass
