"""Tasks of the Redis bucket-store process tests (issue #10 item 2).

Registered only in worker subprocesses that set ``DEBOUNCE_REDIS_TASKS=1``
(a rate-limited task sends every claim of its process through the gate);
the test process enqueues them by name. Every run writes a
:class:`~tests.testapp.models.CallLog` row (task, tag, process, instant).
"""

from __future__ import annotations

import os

from django.utils import timezone

from django_debounce import task

from .models import CallLog


def _record(name: str, tag: str) -> str:
    now = timezone.now()
    CallLog.objects.create(task=name, key=tag, pid=os.getpid(), started_at=now, finished_at=now)
    return tag


def limited(tag: str) -> str:
    return _record("rb.limited", tag)


def steady(tag: str) -> str:
    return _record("rb.steady", tag)


#: name -> (function, options): five an hour (no refill during a test), two a second.
DECLARATIONS = {
    "rb.limited": (limited, {"rate_limit": "5/h", "max_retries": 0}),
    "rb.steady": (steady, {"rate_limit": "2/s", "max_retries": 0}),
}

if os.environ.get("DEBOUNCE_REDIS_TASKS") == "1":
    for _name, (_func, _options) in DECLARATIONS.items():
        task(name=_name, **_options)(_func)
