"""``manage.py plot_edges [--out FILE.png]``: the trailing, leading and both edges, drawn.

Runs the same calls through the three ``edge_*`` tasks on a virtual clock and
the real worker, prints each edge's runs, and draws them (docs/howto/edges.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import plot
from ...edges_plot import CALLS, draw, run_edges


class Command(BaseCommand):
    help = "Run one stream of calls through the trailing, leading and both edges; draw them."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--out", type=Path, default=None, help="PNG to draw (optional).")

    def handle(self, *args: Any, **options: Any) -> None:
        out = options["out"]
        if out is not None:
            try:
                plot.check_target(out)
            except plot.PlotError as exc:
                raise CommandError(f"--out {out}: {exc}") from exc
        runs = run_edges()
        for edge, done in runs.items():
            shown = ", ".join(f"{at:g} (t={payload:g})" for at, payload in done)
            self.stdout.write(f"{edge:>8}: {len(done)} runs at {shown}")
        if out is not None:
            draw(out, runs, CALLS)
            self.stdout.write(f"Drew {out}")
