"""``manage.py plot_rules [--out FILE.png]``: throttle, coalesce and debounce, drawn.

Runs the same calls through the three ``rule_*`` tasks on a virtual clock and the
real worker, prints each rule's runs, and draws them
(docs/explanation/throttle-coalesce-debounce.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import plot
from ...rules_plot import CALLS, draw, run_rules


class Command(BaseCommand):
    help = (
        "Run one stream of calls through a throttled, a coalesced and a debounced task; draw them."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--out", type=Path, default=None, help="PNG to draw (optional).")

    def handle(self, *args: Any, **options: Any) -> None:
        out = options["out"]
        if out is not None:
            try:
                plot.check_target(out)
            except plot.PlotError as exc:
                raise CommandError(f"--out {out}: {exc}") from exc
        runs = run_rules()
        for rule, done in runs.items():
            shown = ", ".join(f"{at:g} (t={payload:g})" for at, payload in done)
            self.stdout.write(f"{rule:>8}: {len(done)} runs at {shown}")
        if out is not None:
            draw(out, runs, CALLS)
            self.stdout.write(f"Drew {out}")
