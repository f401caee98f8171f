"""``django_debounce_edge_runs_total{edge}``: a window's first run by its run of the burst (decision 197).

Window 10 s, max wait 60 s, under the frozen clock; real calls, the real worker.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from django_debounce import debounced_task
from django_debounce.contrib.prometheus import metrics
from django_debounce.models import Job

pytestmark = pytest.mark.django_db
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}
NAME = "django_debounce_edge_runs_total"


@debounced_task(name="met_edge.both", debounce_edge="both", queue="met-edge", **WINDOW)
def both(doc, revision=0):
    """Both edges."""


@debounced_task(name="met_edge.trailing", queue="met-edge", **WINDOW)
def trailing(doc):
    """Trailing edge."""


def value(task: str, edge: str) -> float:
    labels = {"queue": "met-edge", "task_name": task, "edge": edge}
    return REGISTRY.get_sample_value(NAME, labels) or 0.0


def test_leading_and_trailing_runs_are_counted_by_a_two_valued_label(clock, burst):
    metrics.install()
    tasks, edges = ("met_edge.both", "met_edge.trailing"), ("leading", "trailing")
    before = {(t, e): value(t, e) for t in tasks for e in edges}
    # Two both bursts of key 1: a burst of three calls (leading + trailing run) and, after
    # it closed, a burst of one call (its leading run only); one trailing window of key 2.
    for at in (0, 3, 5):
        clock(seconds=at)
        both.delay(1, revision=at)
        trailing.delay(2)
        burst(queue=["met-edge"])
    clock(seconds=15)
    burst(queue=["met-edge"])  # the trailing runs: both's at T+15, trailing's at T+15
    clock(seconds=40)
    both.delay(1, revision=40)
    burst(queue=["met-edge"])
    runs = Job.objects.filter(queue="met-edge", status="SUCCESSFUL")
    assert [(j.task_name, j.kwargs, j.started_at.second) for j in runs.order_by("pk")] == [
        ("met_edge.both", {"revision": 0}, 0),
        ("met_edge.trailing", {}, 15),
        ("met_edge.both", {"revision": 3}, 15),
        ("met_edge.both", {"revision": 40}, 40),
    ]
    moved = {key: value(*key) - before[key] for key in before}
    assert moved == {
        ("met_edge.both", "leading"): 2,
        ("met_edge.both", "trailing"): 1,
        ("met_edge.trailing", "leading"): 0,
        ("met_edge.trailing", "trailing"): 1,
    }
    # The label has two values, whatever the keys: never a key or a job id.
    labels = {
        tuple(sorted(sample.labels))
        for family in REGISTRY.collect()
        if family.name == "django_debounce_edge_runs"
        for sample in family.samples
    }
    assert labels == {("edge", "queue", "task_name")}
