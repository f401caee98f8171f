"""``manage.py debounce_status``: the queues at a glance (issue #11, item 2).

READY / due / RUNNING per queue with the age of the oldest due job and the
runs of the last minute; the busiest open windows; dead letters by kind; open
breakers and exhausted token buckets; live workers. ``--format json`` prints
the same snapshot for scripts; ``--watch`` redraws it in place until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_debounce.management.arguments import bounded_int
from django_debounce.management.database_ready import require_tables

from ...ops.status import MAX_TOP_WINDOWS, TOP_WINDOWS, collect_status, render_status, screen_size

#: ANSI: cursor home, then clear the screen (a real terminal only).
CLEAR = "\x1b[H\x1b[2J"
#: ``--watch`` redraws at most twice a second and at least once a day (decision 133).
WATCH_MIN, WATCH_MAX = 0.5, 86400.0


def watch_seconds(value: str) -> float:
    """Parse ``--watch SECONDS``: a number from 0.5 to 86400 (nan and inf refused)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(number) and WATCH_MIN <= number <= WATCH_MAX):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be from {WATCH_MIN} to {WATCH_MAX:.0f} seconds (one day)"
        )
    return number


#: ``--top N``: from 1 to :data:`~django_debounce.ops.status.MAX_TOP_WINDOWS` (decision 164).
top_windows = bounded_int(MAX_TOP_WINDOWS)


class Command(BaseCommand):
    help = (
        "Show READY/due/RUNNING jobs per queue, the oldest due job's age, runs in the last "
        "minute, the busiest open windows, dead letters by kind, open breakers, exhausted "
        "token buckets and live workers."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--format", choices=["text", "json"], default="text", help="Output format."
        )
        parser.add_argument(
            "--watch",
            nargs="?",
            type=watch_seconds,
            const=2.0,
            default=None,
            metavar="SECONDS",
            help="Redraw every SECONDS (0.5 to 86400, default 2) until Ctrl-C; with "
            "--format json, one compact JSON document per line (JSON Lines).",
        )
        parser.add_argument(
            "--top",
            type=top_windows,
            default=TOP_WINDOWS,
            help=f"Open windows to list, busiest first (1 to {MAX_TOP_WINDOWS}, "
            f"default {TOP_WINDOWS}).",
        )
        parser.add_argument(
            "--database", default="default", help="Database alias (default 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        every = options["watch"]
        if every is not None:  # call_command() passes keywords without argparse's type=
            try:
                every = watch_seconds(str(every))
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"argument --watch: {exc}") from None
        try:
            options["top"] = top_windows(str(options["top"]))
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"argument --top: {exc}") from None
        require_tables(options["database"])
        try:
            while True:
                self._show(options)
                if every is None:
                    return
                time.sleep(every)
        except KeyboardInterrupt:
            self.stdout.write("")  # Ctrl-C ends --watch; exit status 0

    def _show(self, options: dict[str, Any]) -> None:
        snapshot = collect_status(using=options["database"], top=options["top"])
        watching = options["watch"] is not None
        if options["format"] == "json":
            if watching:  # JSON Lines: one document per line, for `| jq -c` or a log
                self.stdout.write(json.dumps(snapshot, sort_keys=True, separators=(",", ":")))
            else:
                self.stdout.write(json.dumps(snapshot, indent=2, sort_keys=True))
            return
        tty = self.stdout.isatty()
        width, height = screen_size(tty)
        if watching and tty:
            # One line is left for the cursor: the heading never scrolls away.
            text = render_status(snapshot, width=width, height=(height or 24) - 1)
            self.stdout.write(CLEAR + text)
        else:
            text = render_status(snapshot, width=width)
            self.stdout.write(text + ("\n" if watching else ""))
