"""``replay_events --plot`` (issue #11, item 5): a PNG of the expected size from a small replay."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_debounce.models import Job
from example_project.docs.plot import busiest_span, png_size
from example_project.docs.tasks import rebuild_docs

pytestmark = pytest.mark.django_db


def test_plot_writes_a_png_of_the_expected_size(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "replay.png"
    out = StringIO()
    call_command(
        "replay_events",
        limit=120,
        plot=target,
        plot_keys=5,
        plot_hours=24 * 14,
        no_progress=True,
        stdout=out,
    )
    assert png_size(target) == (1200, 800)
    runs = Job.objects.filter(task_name=rebuild_docs.name, status=Job.Status.SUCCESSFUL).count()
    line = out.getvalue().splitlines()[-1]
    assert line.startswith(f"Drew {target} (1200x800 px): 5 folders, ")
    # The built-in stream's first 120 events span less than the 14 days drawn: every call
    # and every run is in the picture.
    assert line.endswith(f"120 calls, {runs:,} runs")


def test_plot_needs_a_virtual_replay(tmp_path):
    with pytest.raises(CommandError, match="--plot draws a --virtual replay"):
        call_command("replay_events", mode="real-time", plot=tmp_path / "x.png")


def test_busiest_span_finds_the_densest_stretch():
    times = [0, 1, 50, 51, 52, 53, 200]
    assert busiest_span(times, 10) == (50, 60)
    assert busiest_span([5.0], 10) == (5.0, 15.0)


@pytest.mark.parametrize(
    "name, message",
    [
        ("missing/replay.png", "directory '{tmp}/missing' does not exist"),
        ("replay.txt", ".txt is not an image extension matplotlib writes; end the file name"),
        ("replay", "no image extension matplotlib writes; end the file name in one of: "),
    ],
)
def test_a_bad_plot_path_is_refused_before_the_replay(tmp_path, name, message):
    """The path is checked first: a replay takes minutes (nothing is enqueued or reset)."""
    pytest.importorskip("matplotlib")
    before = Job.objects.count()
    rebuild_docs.delay("docs/keep")  # a reset would delete it
    with pytest.raises(CommandError) as caught:
        call_command("replay_events", limit=20, plot=tmp_path / name, no_progress=True)
    assert str(caught.value).startswith(f"--plot {tmp_path / name}: ")
    assert message.format(tmp=tmp_path) in str(caught.value)
    assert Job.objects.count() == before + 1


def test_svg_is_written_too(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "replay.svg"
    call_command("replay_events", limit=60, plot=target, no_progress=True, stdout=StringIO())
    assert target.read_text()[:200].lstrip().startswith("<?xml")


@pytest.mark.parametrize("option", [{"plot_keys": 3}, {"plot_hours": 2.0}])
def test_plot_shape_options_need_plot(option):
    flag = "--" + next(iter(option)).replace("_", "-")
    with pytest.raises(CommandError, match=f"^{flag} shapes --plot; add --plot FILE.$"):
        call_command("replay_events", limit=20, **option)
