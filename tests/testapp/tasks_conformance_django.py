"""Django ``@task`` twins of the conformance tasks (tests/testapp/tasks_conformance.py).

The ``django_tasks`` mode of tests/processes/test_conformance.py enqueues
these with Django's own ``task.enqueue(...)`` on ``DebounceBackend``
(``TASKS["default"]`` of tests/settings.py). Each twin has its original's
debounce and retry options and writes the same
:class:`~tests.testapp.models.CallLog` row under the same ``conf.*`` name, so
the suite's assertions hold unchanged. The attempt and the job id come from
Django's ``TaskContext`` (``takes_context=True``): ``context.attempt`` and
``context.task_result.id``, which ``DebounceBackend`` fills from the running job.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.utils import timezone

from .models import CallLog

try:  # Django 6.0+
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task


def _log(name: str, context: TaskContext, key: str, payload: dict[str, Any]) -> CallLog:
    return CallLog.objects.create(
        task=name,
        key=key,
        payload={"attempt": context.attempt, **payload},
        job_id=int(context.task_result.id),
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task(takes_context=True, debounce="1s", debounce_max_wait="30s", debounce_key="c:{key}")
def collapse(context: TaskContext, key: str, seq: int) -> None:
    """A burst on one key runs once, with the first call's payload."""
    _log("conf.collapse", context, key, {"seq": seq})


@task(
    takes_context=True,
    debounce="1s",
    debounce_max_wait="30s",
    debounce_key="l:{key}",
    debounce_replace_payload=True,
)
def latest(context: TaskContext, key: str, seq: int) -> None:
    """A burst on one key runs once, with the newest call's payload (replace_payload)."""
    _log("conf.latest", context, key, {"seq": seq})


@task(takes_context=True, debounce="1s", debounce_max_wait="2s", debounce_key="m:{key}")
def ceiling(context: TaskContext, key: str, seq: int) -> None:
    """Calls every 300 ms never leave a quiet second: the max wait forces the run."""
    _log("conf.ceiling", context, key, {"seq": seq})


@task(takes_context=True, debounce="200ms", debounce_max_wait="5s", debounce_key="s:{key}")
def slow(context: TaskContext, key: str, seconds: float) -> None:
    """A run long enough for a call to arrive while it runs."""
    log = _log("conf.slow", context, key, {"seconds": seconds})
    time.sleep(seconds)
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


@task(takes_context=True)
def types(context: TaskContext, ident: str, amount: str, when: str, pair: list[int]) -> None:
    """Record the types and values that arrived: a Django task takes JSON values only.

    Django's ``TaskResult`` keeps JSON arguments, so ``DebounceBackend`` refuses
    a ``UUID``/``Decimal``/``datetime`` at the call (``PayloadError``); the
    suite sends their text forms here.
    """
    _log(
        "conf.types",
        context,
        ident,
        {
            "types": [type(v).__name__ for v in (ident, amount, when, pair)],
            "values": [ident, amount, when, pair],
        },
    )


@task(takes_context=True, max_retries=3, min_backoff="200ms", max_backoff="300ms")
def flaky(context: TaskContext, key: str, fail_times: int) -> int:
    """Raise on the first ``fail_times`` attempts, then return the attempt."""
    _log("conf.flaky", context, key, {})
    if context.attempt <= fail_times:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True, max_retries=1, min_backoff="200ms", max_backoff="300ms")
def broken(context: TaskContext, key: str) -> None:
    """Always raise: two runs, then a dead letter."""
    _log("conf.broken", context, key, {})
    raise ValueError(f"broken {key}")
