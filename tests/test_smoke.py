from __future__ import annotations

import pytest

from django_debounce import debounced_task
from django_debounce.models import Job
from tests.testapp.models import CallLog


@pytest.mark.django_db
def test_one_enqueue_runs_once_after_window(clock, burst):
    @debounced_task(debounce="10s", debounce_max_wait="60s", debounce_key="smoke:{0}")
    def smoke(x):
        CallLog.objects.create(task="smoke", payload={"x": x})

    job = smoke.delay(1)
    assert job.outcome == "created"
    clock(seconds=9.999)
    burst()
    assert CallLog.objects.count() == 0
    clock(seconds=10)
    burst()
    assert list(CallLog.objects.values_list("payload", flat=True)) == [{"x": 1}]
    assert Job.objects.get().status == Job.Status.SUCCESSFUL
