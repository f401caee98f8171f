"""Prometheus counters and histograms, counted in-process from the package's signals (issue #11)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from django_debounce import registry
from django_debounce.contrib.prometheus import metrics
from django_debounce.models import DeadLetter, Job
from tests.testapp import tasks_flow
from tests.testapp.tasks_metrics import burst as burst_task
from tests.testapp.tasks_metrics import fail, plain, unique

pytestmark = pytest.mark.django_db

Q = {"queue": "metrics"}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def delta() -> Iterator[Callable[..., float]]:
    """``delta(name, **labels)``: how much a sample moved since the test began."""
    metrics.install()
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            before[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return value(name, **labels) - before.get(key, 0.0)

    yield moved


def test_the_worked_scenario_counts_calls_runs_forced_runs_and_delays(clock, burst, delta):
    # §4's scenario: window 10 s, max wait 60 s, a call every 5 s from t=0 to t=120,
    # due jobs run before each call: runs at t=60 and t=120 (forced) and t=130 (quiet).
    for t in range(0, 121, 5):
        clock(seconds=t)
        burst(queues=["metrics"])
        burst_task.delay("k")
    clock(seconds=130)
    burst(queues=["metrics"])

    labels = {**Q, "task_name": "met.burst"}
    assert Job.objects.filter(task_name="met.burst").count() == 3
    assert delta("django_debounce_created_total", **labels) == 3
    assert delta("django_debounce_debounced_total", **labels) == 22
    assert delta("django_debounce_coalesced_total", **labels) == 0
    assert delta("django_debounce_runs_started_total", **labels) == 3
    assert delta("django_debounce_forced_runs_total", **labels) == 2
    assert delta("django_debounce_debounce_delay_seconds_count", **labels) == 3
    assert delta("django_debounce_debounce_delay_seconds_sum", **labels) == 60 + 60 + 10
    # Buckets are cumulative: 10 s fits le=10, the 60 s ones first fit le=60.
    assert delta("django_debounce_debounce_delay_seconds_bucket", **labels, le="10.0") == 1
    assert delta("django_debounce_debounce_delay_seconds_bucket", **labels, le="30.0") == 1
    assert delta("django_debounce_debounce_delay_seconds_bucket", **labels, le="60.0") == 3
    assert delta("django_debounce_jobs_finished_total", **labels, status="SUCCESSFUL") == 3
    # The frozen clock does not tick while a task runs: every attempt took 0 s.
    assert delta("django_debounce_attempt_duration_seconds_count", **labels) == 3
    assert delta("django_debounce_attempt_duration_seconds_sum", **labels) == 0


def test_coalesced_calls_retries_and_dead_letters(clock, burst, delta):
    first = unique.delay("a")
    assert unique.delay("a").pk == first.pk
    fail.delay("x")
    burst(queues=["metrics"])  # met.fail: attempt 1 raises, retry in 1 s
    clock(seconds=5)
    burst(queues=["metrics"])  # attempt 2 raises: no retry left, dead letter

    assert delta("django_debounce_created_total", **Q, task_name="met.unique") == 1
    assert delta("django_debounce_coalesced_total", **Q, task_name="met.unique") == 1
    failing = {**Q, "task_name": "met.fail"}
    assert delta("django_debounce_runs_started_total", **failing) == 2
    assert delta("django_debounce_retries_total", **failing) == 1
    assert delta("django_debounce_jobs_finished_total", **failing, status="FAILED") == 1
    assert delta("django_debounce_dead_letters_total", **failing, kind="failure") == 1
    assert delta("django_debounce_attempt_duration_seconds_count", **failing) == 2
    # Not debounced: no delay observed, nothing forced.
    assert delta("django_debounce_debounce_delay_seconds_count", **failing) == 0
    assert DeadLetter.objects.filter(task_name="met.fail").count() == 1


@pytest.fixture
def flow() -> Iterator[dict[str, Any]]:
    tasks = tasks_flow.register()
    yield tasks
    for name in tasks:
        registry.unregister(name)


def test_sheds_are_counted_by_kind_without_the_lifecycle_signals(
    clock, burst, flow, delta, django_capture_on_commit_callbacks
):
    for i in range(25):
        flow["flow.rate_drop"].delay(f"d{i:02}")
    # _job_shed is sent when the claim commits: the test's own transaction never does.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        burst()
    assert len(callbacks) == 15
    labels = {"queue": "default", "task_name": "flow.rate_drop"}
    assert Job.objects.filter(task_name="flow.rate_drop", status=Job.Status.SHED).count() == 15
    assert delta("django_debounce_jobs_finished_total", **labels, status="SHED") == 15
    assert delta("django_debounce_dead_letters_total", **labels, kind="shed") == 15
    assert delta("django_debounce_jobs_finished_total", **labels, status="SUCCESSFUL") == 10


def test_metrics_off_counts_nothing(settings, clock, burst, delta):
    settings.DEBOUNCE_METRICS = False
    plain.delay("off")
    burst(queues=["metrics"])
    labels = {**Q, "task_name": "met.plain"}
    assert Job.objects.get(task_name="met.plain").status == Job.Status.SUCCESSFUL
    assert delta("django_debounce_created_total", **labels) == 0
    assert delta("django_debounce_runs_started_total", **labels) == 0


def test_the_view_serves_counts_and_database_gauges(client, clock, burst, delta):
    plain.delay("v1")
    plain.delay("v2")
    burst(queues=["metrics"])
    plain.delay("v3")  # READY and due
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST  # the text format
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    labels = tuple(sorted({**Q, "task_name": "met.plain"}.items()))
    assert samples[("django_debounce_created_total", labels)] == value(
        "django_debounce_created_total", **dict(labels)
    )
    assert delta("django_debounce_created_total", **dict(labels)) == 3
    assert samples[("django_debounce_ready_jobs", labels)] == 1
    assert samples[("django_debounce_due_jobs", labels)] == 1
    assert samples[("django_debounce_running_jobs", labels)] == 0
    assert samples[("django_debounce_collector_up", ())] == 1
    assert client.post("/metrics/").status_code == 405


def test_head_answers_like_get_without_a_body(client):
    """The docstring's promise: GET and HEAD (Django's ``require_safe``)."""
    response = client.head("/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    assert response.content == b""


def test_the_view_answers_404_when_metrics_are_off(client, settings, django_assert_num_queries):
    """``DEBOUNCE_METRICS = False``: like the worker's refused ``--metrics-port`` (decision 131)."""
    settings.DEBOUNCE_METRICS = False
    with django_assert_num_queries(0):
        response = client.get("/metrics/")
    assert response.status_code == 404
    assert response.content == b"metrics are off (DEBOUNCE_METRICS = False)\n"
