"""``debounce_status`` shows each task's edge and each window's run of its burst (decision 197).

Window 10 s, max wait 60 s, under the frozen clock; real calls, the real worker.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from django_debounce import debounced_task
from django_debounce.ops.status import render_status

pytestmark = pytest.mark.django_db
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}


@debounced_task(name="st_edge.both", debounce_edge="both", queue="st-edge", **WINDOW)
def both(doc, revision=0):
    """Both edges."""


@debounced_task(name="st_edge.leading", debounce_edge="leading", queue="st-edge", **WINDOW)
def leading(doc):
    """Leading edge."""


def status(fmt: str = "json") -> str:
    out = io.StringIO()
    call_command("debounce_status", format=fmt, stdout=out)
    return out.getvalue()


def only_mine(snapshot: dict) -> dict:
    return {
        **snapshot,
        "edges": [e for e in snapshot["edges"] if e["task_name"].startswith("st_edge.")],
        "windows": [w for w in snapshot["windows"] if w["task_name"].startswith("st_edge.")],
    }


def mine(snapshot: dict) -> list[tuple]:
    return [
        (w["id"], w["task_name"], w["calls"], w["edge"])
        for w in snapshot["windows"]
        if w["task_name"].startswith("st_edge.")
    ]


def test_status_lists_the_edges_and_which_run_each_window_is(clock, burst):
    first = both.delay(1, revision=0)
    lead = leading.delay(2)
    clock(seconds=1)
    assert leading.delay(2).pk == lead.pk  # swallowed into the pending leading job
    snapshot = json.loads(status())
    edges = [e for e in snapshot["edges"] if e["task_name"].startswith("st_edge.")]
    assert edges == [
        {"task_name": "st_edge.both", "edge": "both", "debounce": 10.0, "max_wait": 60.0},
        {"task_name": "st_edge.leading", "edge": "leading", "debounce": 10.0, "max_wait": 60.0},
    ]
    assert sorted(mine(snapshot)) == [
        (first.pk, "st_edge.both", 1, "leading"),
        (lead.pk, "st_edge.leading", 2, "leading"),
    ]
    assert "edges other than trailing (window, max wait)" in status("text")
    # The text of this test's rows (other test modules register edge tasks of their own,
    # and the text view draws ten rows of each list).
    lines = render_status(only_mine(snapshot)).splitlines()
    assert any(
        line.split() == ["st_edge.both", "both", "window", "10s", "max", "60s"] for line in lines
    )
    assert any(line.startswith(f"  #{first.pk} ") and line.endswith(" lead") for line in lines)

    burst(queue=["st-edge"])  # both leading runs, at T+1
    clock(seconds=3)
    second = both.delay(1, revision=1)
    clock(seconds=4)
    assert both.delay(1, revision=2).pk == second.pk
    snapshot = json.loads(status())
    assert mine(snapshot) == [(second.pk, "st_edge.both", 2, "trailing")]
    window = next(w for w in snapshot["windows"] if w["id"] == second.pk)
    # The trailing job is the burst's: opened with the leading call, due a window after the last.
    assert (window["opened_at"], window["deadline"], window["max_run_at"]) == (
        "2026-03-01T12:00:00+00:00",
        "2026-03-01T12:00:14+00:00",
        "2026-03-01T12:01:00+00:00",
    )
    lines = render_status(only_mine(snapshot)).splitlines()
    assert any(line.startswith(f"  #{second.pk} ") for line in lines)
    assert not any(line.startswith(f"  #{second.pk} ") and line.endswith(" lead") for line in lines)
