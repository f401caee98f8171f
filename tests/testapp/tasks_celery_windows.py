"""Tasks of the edge and window-handle scenario run by either executor (issue #21 item 4).

No ``executor=``: ``DEBOUNCE_EXECUTOR`` (``DEBOUNCE_TEST_EXECUTOR`` in the
subprocesses, tests/settings_celery.py) picks the built-in worker or Celery, so
one scenario runs through both (tests/processes/contrib/celery/test_celery_windows.py).
Every run writes one :class:`~tests.testapp.models.CallLog` row.
"""

from __future__ import annotations

import os
from typing import Any

from django.utils import timezone

from django_debounce import registry, task
from django_debounce.context import JobContext

from .models import CallLog


def _log(name: str, context: JobContext, key: str, n: int) -> None:
    CallLog.objects.create(
        task=name,
        key=key,
        payload={"n": n, "worker": context.job.worker_id if context.job is not None else ""},
        job_id=context.job.pk if context.job is not None else None,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task(
    name="celw.both",
    debounce="1s",
    debounce_max_wait="30s",
    debounce_key="both:{key}",
    debounce_edge="both",
    takes_context=True,
)
def both(context: JobContext, key: str, n: int = 0) -> int:
    """Both edges: a burst's first call at once, one trailing run a second after quiet."""
    _log("celw.both", context, key, n)
    return n


@task(
    name="celw.held",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="held:{key}",
    takes_context=True,
)
def held(context: JobContext, key: str, n: int = 0) -> int:
    """A window that only a flush makes due within the test."""
    _log("celw.held", context, key, n)
    return n


def keyrated(context: JobContext, key: str, n: int = 0) -> int:
    """Two runs a minute per key (defer beyond): a key's third run waits for its token."""
    _log("celw.keyrated", context, key, n)
    return n


#: The per-key rated task's options. A gated task sends every claim of its process
#: through the gate, so it is registered only on demand (as tasks_keyrate's): by
#: :func:`register_keyrated` in the test process, at import when
#: ``DEBOUNCE_CELW_KEYRATED=1`` (the test's worker and Celery subprocesses).
KEYRATED = {
    "name": "celw.keyrated",
    "debounce": "200ms",
    "debounce_max_wait": "5s",
    "debounce_key": "rated:{key}",
    "rate_limit_per_key": "2/m",
    "takes_context": True,
}


def register_keyrated() -> Any:
    """Register ``celw.keyrated`` (idempotent); return the task."""
    return task(**KEYRATED)(keyrated)


def unregister_keyrated() -> None:
    registry.unregister("celw.keyrated")


if os.environ.get("DEBOUNCE_CELW_KEYRATED") == "1":
    register_keyrated()
