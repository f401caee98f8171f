"""A flush that waited for a call's lock is due no earlier than that call (decision 200).

Found by the both-edge window-handle race (tests/processes/ops/test_window_handle_races.py):
on MariaDB a flush took its instant, then waited for a producer's insert of a leading job,
and made that job due 17 ms before its window opened. Here the flush's instant is given
(``flush(now=...)``) as such a waiting flush has it, under the frozen clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from django_debounce import debounced_task
from django_debounce.models import Job
from tests.conftest import T

pytestmark = pytest.mark.django_db
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{0}"}


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


@debounced_task(name="flush_at.trailing", **WINDOW)
def trailing(doc, revision=0):
    """Trailing edge."""


@debounced_task(name="flush_at.both", debounce_edge="both", **WINDOW)
def both(doc, revision=0):
    """Both edges."""


def test_a_flush_older_than_the_last_call_is_due_at_that_call(clock):
    job = trailing.delay(1)
    clock(seconds=3)
    trailing.delay(1, revision=1)
    action = trailing.window(1).flush(now=s(1))
    assert (action.done, action.window.deadline) == (True, s(3))
    stored = Job.objects.get(pk=job.pk)
    assert (stored.opened_at, stored.last_enqueued_at, stored.run_at) == (T, s(3), s(3))
    # A flush at or after the last call is due at its own instant, as before.
    trailing.delay(2)
    clock(seconds=5)
    assert trailing.window(2).flush().window.deadline == s(5)


def test_a_leading_job_flushed_with_an_older_instant_stays_due_when_it_opened(clock):
    clock(seconds=5)
    lead = both.delay(1)
    action = both.window(1).flush(now=s(4))
    assert action.done
    stored = Job.objects.get(pk=lead.pk)
    assert stored.run_at == stored.opened_at == s(5)
