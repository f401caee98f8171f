"""``add_worker_metrics(app)`` adds the worker options and the bootstep once (decision 135)."""

from __future__ import annotations

import click
import pytest
from celery import Celery
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool

from django_debounce.contrib.celery.metrics import (
    ADDR_OPTION,
    PORT_OPTION,
    MetricsServer,
    add_worker_metrics,
)


def test_the_options_and_the_step_are_added_once() -> None:
    app = Celery("unit", set_as_current=False)
    add_worker_metrics(app)
    add_worker_metrics(app)
    options = [opt.opts for opt in app.user_options["worker"]]
    assert sorted(options) == [[ADDR_OPTION], [PORT_OPTION]]
    assert [step for step in app.steps["worker"] if step is MetricsServer] == [MetricsServer]


def test_without_a_port_the_step_stays_out_of_the_worker() -> None:
    step = MetricsServer(object(), debounce_metrics_port=None)
    assert step.enabled is False and step.server is None


class _Worker:
    """What the bootstep reads of a ``WorkController``: its pool class."""

    def __init__(self, pool_cls: type) -> None:
        self.pool_cls = pool_cls


@pytest.mark.parametrize(
    ("pool", "metrics", "multiproc", "error"),
    [
        (PreforkPool, None, None, "prefork pool needs PROMETHEUS_MULTIPROC_DIR"),
        (SoloPool, False, None, "metrics are off (DEBOUNCE_METRICS = False)"),
        (SoloPool, "yes", None, "DEBOUNCE_METRICS"),
    ],
)
def test_a_worker_that_could_not_serve_is_a_usage_error(
    settings, monkeypatch, pool, metrics, multiproc, error
) -> None:
    settings.DEBOUNCE_METRICS = metrics
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(click.UsageError) as caught:
        MetricsServer(_Worker(pool), debounce_metrics_port=9108)
    assert error in caught.value.message
    assert caught.value.message.startswith(PORT_OPTION)
