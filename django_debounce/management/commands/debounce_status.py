"""``manage.py debounce_status``: the queues at a glance (issue #11, item 2).

READY / due / RUNNING per queue with the age of the oldest due job and the
runs of the last minute; the busiest open windows; dead letters by kind; open
breakers and exhausted token buckets; live workers. ``--format json`` prints
the same snapshot for scripts; ``--watch`` redraws it in place until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from typing import Any

from django.core.management.base import BaseCommand

from django_debounce.management.arguments import positive_float, positive_int
from django_debounce.management.database_ready import require_tables
from django_debounce.status import TOP_WINDOWS, collect_status, render_status

#: ANSI: cursor home, then clear the screen (a real terminal only).
CLEAR = "\x1b[H\x1b[2J"


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
            type=positive_float,
            const=2.0,
            default=None,
            metavar="SECONDS",
            help="Redraw every SECONDS (default 2) until Ctrl-C.",
        )
        parser.add_argument(
            "--top",
            type=positive_int,
            default=TOP_WINDOWS,
            help=f"Open windows to list, busiest first (default {TOP_WINDOWS}).",
        )
        parser.add_argument(
            "--database", default="default", help="Database alias (default 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        every = options["watch"]
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
        if options["format"] == "json":
            self.stdout.write(json.dumps(snapshot, indent=2, sort_keys=True))
            return
        width = max(60, min(shutil.get_terminal_size((80, 24)).columns, 80))
        text = render_status(snapshot, width=width)
        if options["watch"] is not None and self.stdout.isatty():
            self.stdout.write(CLEAR + text)
        else:
            self.stdout.write(text + ("\n" if options["watch"] is not None else ""))
