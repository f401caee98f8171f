"""factory-boy factories for rows the tests seed directly (explicit defaults)."""

from __future__ import annotations

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from django_debounce.models import DeadLetter, Job


class JobFactory(DjangoModelFactory):
    """A plain READY job of ``tests.noop``, due now, never claimed."""

    class Meta:
        model = Job

    task_name = "tests.noop"
    queue = "default"
    priority = 0
    status = Job.Status.READY
    args = factory.LazyFunction(list)
    kwargs = factory.LazyFunction(dict)
    run_at = factory.LazyFunction(timezone.now)
    opened_at = None
    max_run_at = None
    debounce_key = None
    window_key = None
    key_hash = None
    unique_key = None
    unique_lock = None
    enqueue_count = 1
    created_at = factory.LazyFunction(timezone.now)
    last_enqueued_at = factory.SelfAttribute("created_at")
    attempts = 0
    max_retries = 3
    result = None
    error = ""
    traceback = ""
    metadata = factory.LazyFunction(dict)
    notes = ""
    expires_at = None
    started_at = None
    finished_at = None
    worker_id = ""
    lease_expires_at = None


class DeadLetterFactory(DjangoModelFactory):
    """A ``failed:`` dead letter of a FAILED ``tests.noop`` job (one attempt, ValueError)."""

    class Meta:
        model = DeadLetter

    job = factory.SubFactory(
        JobFactory,
        status=Job.Status.FAILED,
        attempts=1,
        max_retries=0,
        error="ValueError: boom",
        finished_at=factory.LazyFunction(timezone.now),
    )
    task_name = factory.SelfAttribute("job.task_name")
    queue = factory.SelfAttribute("job.queue")
    args = factory.SelfAttribute("job.args")
    kwargs = factory.SelfAttribute("job.kwargs")
    reason = "failed: 1 attempt(s); ValueError: boom"
    metadata = factory.LazyFunction(lambda: {"attempts": 1})
    error = "ValueError: boom"
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    created_at = factory.LazyFunction(timezone.now)
    retried_at = None
    retry_job = None
