"""``manage.py plot_edges`` (decision 180): the three edges on one stream of calls, drawn."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from example_project.docs.edges_plot import run_edges
from example_project.docs.plot import png_size

pytestmark = pytest.mark.django_db


def test_the_three_edges_run_as_the_how_to_says():
    # Calls at 0, 3, 7; every 4 s from 30 to 66; at 90. Window 10 s, max wait 30 s.
    assert run_edges() == {
        "trailing": [(17, 0), (60, 30), (76, 62), (100, 90)],
        "leading": [(0, 0), (30, 30), (62, 62), (90, 90)],
        "both": [(0, 0), (17, 7), (30, 30), (60, 58), (62, 62), (76, 66), (90, 90)],
    }


def test_plot_edges_prints_the_runs_and_draws_them(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "edges.png"
    out = StringIO()
    call_command("plot_edges", out=target, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[1] == " leading: 4 runs at 0 (t=0), 30 (t=30), 62 (t=62), 90 (t=90)"
    assert lines[-1] == f"Drew {target}"
    assert png_size(target) == (1200, 450)
