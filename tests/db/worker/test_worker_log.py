"""The worker's log tells each outcome apart: success, a failed attempt with a retry left, a dead letter."""

from __future__ import annotations

import logging

import pytest

from django_debounce.models import DeadLetter
from tests.testapp.tasks_worker import fail_times, value_error

pytestmark = pytest.mark.django_db


def test_outcomes_are_logged(clock, burst, caplog):
    caplog.set_level(logging.INFO, logger="django_debounce")
    flaky = fail_times.delay("log", 1)
    doomed = value_error.delay()
    burst()
    clock(hours=1)
    burst()
    messages = [r.getMessage() for r in caplog.records if r.name == "django_debounce.worker"]
    letter = DeadLetter.objects.get()
    assert any(
        m.startswith(f"job {flaky.pk} (wrk.fail_times) failed attempt 1 of 4; retry at ")
        for m in messages
    ), messages
    assert f"job {flaky.pk} (wrk.fail_times) succeeded on attempt 2" in messages
    assert (
        f"job {doomed.pk} (wrk.value_error) failed for good; dead letter {letter.pk}: "
        f"{letter.reason}" in messages
    )


def test_every_sweep_leaves_a_line_even_when_it_retried_nothing(burst, caplog, settings):
    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = {"every": "10m", "min_age": "10m", "max_retries": 3}
    caplog.set_level(logging.INFO, logger="django_debounce")
    burst()
    assert any(
        r.getMessage().startswith("dead-letter sweep: retried 0, failed 0") for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
