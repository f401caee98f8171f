"""The reuse of a call's merged options (decision 119): same result as merging each time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from django_debounce import debounced_task, task
from django_debounce.enqueueing.planning import plan_call
from django_debounce.exceptions import ConfigurationError

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


@task(name="unit.merge_cache.plain")
def plain(n):
    """A plain task without max_retries (DEBOUNCE_MAX_RETRIES applies)."""


@debounced_task(name="unit.merge_cache.window", debounce="10s", debounce_max_wait="60s")
def window(key):
    """A debounced task."""


def plan(t, options):
    return plan_call(t, t.name, (1,), {}, options, NOW)


def test_equal_calls_get_equal_plans():
    first = plan(plain, {"priority": 3, "queue": "mail"})
    second = plan(plain, {"priority": 3, "queue": "mail"})
    assert (first.priority, first.queue) == (second.priority, second.queue) == (3, "mail")
    assert plan(plain, {"priority": 4}).priority == 4


def test_the_retries_setting_in_force_is_read_each_time():
    assert plan(plain, {"priority": 2}).max_retries == 3
    with override_settings(DEBOUNCE_MAX_RETRIES=7):
        assert plan(plain, {"priority": 2}).max_retries == 7
    assert plan(plain, {"priority": 2}).max_retries == 3


def test_a_bad_call_raises_every_time_after_a_good_one():
    plan(window, {"debounce": "5s"})
    for _ in range(2):
        with pytest.raises(ConfigurationError, match="max wait"):
            plan(window, {"debounce": "2m"})
        with pytest.raises(ConfigurationError, match="countdown/eta"):
            plan(window, {"debounce": "5s", "countdown": 3})
    assert plan(window, {"debounce": "5s"}).window == timedelta(seconds=5)


def test_two_tasks_never_share_an_entry():
    assert plan(window, {"priority": 1}).window == timedelta(seconds=10)
    assert plan(plain, {"priority": 1}).window is None
