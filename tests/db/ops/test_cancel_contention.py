"""``Job.cancel()`` under lock contention (attack branch, found on MariaDB).

In ``tests/processes/test_every_feature_at_once.py`` on MariaDB, ``Job.cancel()`` of a job
that two workers' claims were locking failed with the raw
``OperationalError: (1213, 'Deadlock found when trying to get lock; try restarting
transaction')``, twice in each run. A window handle's ``cancel()`` retries such a
deadlock (``ops/window_handles.py`` ``_retrying``) and raises ``WindowContentionError``
when it must give up; ``cancel_jobs`` (``Job.cancel()``, ``Window.cancel_running()``,
``debounce_cancel``, the admin) does neither. The test makes the first cancel statement
lose a deadlock, as the claim made it lose one there, on any database.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError

from django_debounce import task
from django_debounce.exceptions import DebounceError
from django_debounce.models import Job
from django_debounce.ops import windows

pytestmark = pytest.mark.django_db(transaction=True)


@task(name="atk.cancelled")
def cancelled() -> None: ...


def test_a_cancel_that_loses_a_deadlock_is_retried_or_a_package_error(monkeypatch):
    job = cancelled.delay()
    real = windows.cancel
    lost: list[int] = []

    def deadlocked_once(*args, **kwargs):
        if not lost:
            lost.append(1)
            raise OperationalError(
                1213, "Deadlock found when trying to get lock; try restarting transaction"
            )
        return real(*args, **kwargs)

    monkeypatch.setattr(windows, "cancel", deadlocked_once)
    try:
        result = job.cancel()
    except DebounceError:
        assert Job.objects.get(pk=job.pk).status == Job.Status.READY  # nothing written
    else:
        assert result.cancelled == [job.pk]
        assert Job.objects.get(pk=job.pk).status == Job.Status.CANCELLED
