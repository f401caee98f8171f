"""``manage.py plot_rules`` (decision 176): throttle, coalesce and debounce on one stream of calls."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from example_project.docs.plot import png_size
from example_project.docs.rules_plot import run_rules

pytestmark = pytest.mark.django_db


def test_the_three_rules_run_as_the_concepts_page_says():
    # Calls at 0, 2, 4, 6, 8; every 4 s from 30 to 66; at 90.
    assert run_rules() == {
        # Every call runs, at most one start per 5 s: the backlog drains at the rate.
        "throttle": [(0, 0), (5, 2), (10, 4), (15, 6), (20, 8), (30, 30), (35, 34), (40, 38)]
        + [(45, 42), (50, 46), (55, 50), (60, 54), (65, 58), (70, 62), (75, 66), (90, 90)],
        # The first call of a key fixes the run (its countdown, 10 s); the calls while it is
        # pending return it and move nothing; the next call after the run starts a new job.
        "coalesce": [(10, 0), (40, 30), (52, 42), (64, 54), (76, 66), (100, 90)],
        # 10 s after the burst's last call (8 + 10), or at the ceiling (30 + 30) of a stream
        # that never goes quiet; the calls at 62 and 66 open the next window.
        "debounce": [(18, 0), (60, 30), (76, 62), (100, 90)],
    }


def test_plot_rules_prints_the_runs_and_draws_them(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "rules.png"
    out = StringIO()
    call_command("plot_rules", out=target, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[2] == "debounce: 4 runs at 18 (t=0), 60 (t=30), 76 (t=62), 100 (t=90)"
    assert lines[-1] == f"Drew {target}"
    assert png_size(target) == (1200, 450)
