"""The read-only admin of issue #2: jobs and dead letters can be listed and viewed, not edited."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_changelist_and_detail_render_for_staff(admin_client, model, django_assert_max_num_queries):
    letter = DeadLetterFactory()
    jobs = [letter.job, *JobFactory.create_batch(30)]
    obj = letter if model == "deadletter" else jobs[1]
    url = reverse(f"admin:django_debounce_{model}_changelist")
    with django_assert_max_num_queries(12):  # bounded: no per-row queries, no full COUNT(*)
        response = admin_client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count == (1 if model == "deadletter" else 31)
    detail = admin_client.get(reverse(f"admin:django_debounce_{model}_change", args=[obj.pk]))
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content  # read-only: no save button


@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_no_add_or_delete(admin_client, model):
    assert admin_client.get(reverse(f"admin:django_debounce_{model}_add")).status_code == 403
    obj = DeadLetterFactory() if model == "deadletter" else JobFactory()
    delete = reverse(f"admin:django_debounce_{model}_delete", args=[obj.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert type(obj).objects.filter(pk=obj.pk).exists()
