"""The admin's "Cancel, asking running jobs to stop" action (decision 186)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from django_debounce.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_debounce_job_changelist")
Status = Job.Status


def _post(client: Any, *ids: int) -> list[str]:
    data = {"action": "cancel_running", "index": "0", "_selected_action": [str(i) for i in ids]}
    response = client.post(JOBS, data, follow=True)
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def test_it_cancels_waiting_jobs_marks_running_ones_and_leaves_finished_ones(admin_client):
    waiting = JobFactory()
    running = JobFactory(
        status=Status.RUNNING, worker_id="w", lease_expires_at=timezone.now(), attempts=1
    )
    done = JobFactory(status=Status.SUCCESSFUL, finished_at=timezone.now())
    assert _post(admin_client, waiting.pk, running.pk, done.pk) == [
        "1 job cancelled.",
        "Cancel requested for 1 running job: it stops at its next checkpoint (a task that "
        f"never checks runs to its end): #{running.pk}.",
        "1 job left alone: it already finished.",
    ]
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert statuses == {waiting.pk: "CANCELLED", running.pk: "RUNNING", done.pk: "SUCCESSFUL"}
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
