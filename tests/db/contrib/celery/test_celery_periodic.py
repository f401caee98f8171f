"""The Celery dispatcher defers periodic ticks and hands their jobs to Celery (decision 177)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from django_debounce import Schedule, registry, task
from django_debounce.contrib.celery.executor import Dispatcher
from django_debounce.models import Job, PeriodicTick
from tests.celery_app import REDIS, make_app
from tests.conftest import T, require_service
from tests.processes.celery_rig import broker_up


@pytest.fixture
def periodic_celery_task():
    @task(name="per.celery", executor="celery", schedule=Schedule("*/10 * * * *", tz="UTC"))
    def body() -> None: ...

    yield body
    registry.unregister("per.celery")


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_defers_a_tick_and_publishes_its_job(settings, clock, periodic_celery_task):
    require_service(broker_up(REDIS), f"needs the local Redis at {REDIS}")
    queue = f"dbt-{uuid.uuid4().hex[:10]}"
    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    settings.DEBOUNCE_CELERY_QUEUES = {"default": queue}
    app = make_app(REDIS)
    clock(at=T + dt.timedelta(minutes=1))
    try:
        assert Dispatcher(burst=True, handle_signals=False, periodic=False).run() == 0
        assert Dispatcher(burst=True, handle_signals=False).run() == 1
        assert Dispatcher(burst=True, handle_signals=False).run() == 0  # the tick is taken
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            messages = [channel.basic_get(queue, no_ack=True) for _ in range(2)]
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    (job,) = Job.objects.filter(task_name="per.celery")
    assert messages[1] is None and messages[0].headers["id"] == str(job.pk)
    assert list(PeriodicTick.objects.values_list("tick", "job_id")) == [(T, job.pk)]
