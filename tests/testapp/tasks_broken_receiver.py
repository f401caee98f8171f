"""A ``job_started`` receiver that raises, connected only in worker subprocesses that ask
for it (``DEBOUNCE_TEST_BROKEN_RECEIVER=1``; tests/processes/worker/test_worker_command_line.py)."""

from __future__ import annotations

import os
from typing import Any

from django_debounce.models import Job
from django_debounce.signals import job_started

#: What the receiver raises (a ``RuntimeError``), to find its log line.
MESSAGE = "broken job_started receiver"


def _broken(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError(MESSAGE)


if os.environ.get("DEBOUNCE_TEST_BROKEN_RECEIVER") == "1":
    job_started.connect(_broken, sender=Job, dispatch_uid="tests.testapp.broken_receiver")
