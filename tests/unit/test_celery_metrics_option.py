"""``add_worker_metrics(app)`` adds the worker options and the bootstep once (decision 135)."""

from __future__ import annotations

from celery import Celery

from django_debounce.celery_metrics import (
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
