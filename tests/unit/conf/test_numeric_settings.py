"""Numeric settings: NaN and infinity refused by their check and at run time (issue #17
follow-ups, items 1-2; decisions 162-163). The check and the run time share one parser,
so what ``manage.py check`` passes is what the worker and an enqueue accept."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
from django.core.checks import ERROR

from django_debounce.checks import settings as checks
from django_debounce.conf import settings as debounce_settings
from django_debounce.contrib.celery.checks import check_handoff_lease
from django_debounce.contrib.prometheus.checks import check_metrics
from django_debounce.exceptions import ConfigurationError
from django_debounce.management.arguments import positive_float

NAN, INF = float("nan"), float("inf")

#: Every setting that holds a number of seconds, or holds one inside it, with its check id.
NUMERIC_SETTINGS = [
    ("DEFAULT_WINDOW", lambda v: v, "E001"),
    ("DEFAULT_MAX_WAIT", lambda v: v, "E002"),
    ("LEASE", lambda v: v, "E004"),
    ("MIN_BACKOFF", lambda v: v, "E005"),
    ("MAX_BACKOFF", lambda v: v, "E006"),
    ("SHUTDOWN_GRACE", lambda v: v, "E007"),
    ("POLL_INTERVAL", lambda v: v, "E010"),
    ("QUEUES", lambda v: {"q": {"codel": {"target": v, "interval": "5s"}}}, "E012"),
    ("DEAD_LETTER_AUTO_RETRY", lambda v: {"every": v}, "E013"),
    ("PRUNE", lambda v: {"older_than": v}, "E045"),
    ("METRICS_DELAY_BUCKETS", lambda v: (1, 5, v), "E041"),
    ("METRICS_DURATION_BUCKETS", lambda v: (v,), "E041"),
    ("UNKNOWN_TASK_GRACE", lambda v: v, "E044"),
    ("CELERY_HANDOFF_LEASE", lambda v: v, "E027"),
    ("PREFETCH", lambda v: v, "E055"),
    ("SUCCESS_FLUSH_INTERVAL", lambda v: v, "E056"),
    ("MAX_RETRIES", lambda v: v, "E009"),
    ("ENQUEUE_RETRIES", lambda v: v, "E015"),
]


def setting_checks() -> list[Any]:
    """Every check that reads a ``DEBOUNCE_*`` setting (none of them connects): the loop
    over the settings table and the named checks that judge a parsed value."""
    return [*checks.check_settings(), *check_metrics(), *check_handoff_lease()]


@pytest.mark.parametrize("number", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("name", "shape", "code"), NUMERIC_SETTINGS, ids=[row[0] for row in NUMERIC_SETTINGS]
)
def test_nan_and_infinity_fail_the_settings_own_check_with_a_hint(
    settings, name, shape, code, number
):
    """``DEBOUNCE_POLL_INTERVAL = float("nan")`` passed E010 and crashed the worker."""
    setattr(settings, f"DEBOUNCE_{name}", shape(number))

    messages = setting_checks()

    assert [m.id for m in messages] == [f"django_debounce.{code}"]
    (message,) = messages
    assert message.level == ERROR
    assert f"DEBOUNCE_{name}" in message.msg
    assert message.hint


@pytest.mark.parametrize("number", [NAN, INF, -INF, 86401, 1e300])
def test_the_worker_reads_no_poll_interval_the_check_refuses(settings, number):
    """The worker took ``float(value)``: NaN reached ``wakeup.idle_timeout`` and raised
    ``ValueError: cannot convert float NaN to integer``."""
    settings.DEBOUNCE_POLL_INTERVAL = number

    with pytest.raises(ConfigurationError) as raised:
        debounce_settings.poll_interval  # noqa: B018

    assert str(raised.value) == (
        f"DEBOUNCE_POLL_INTERVAL={number!r} must be a finite number of seconds greater "
        "than 0 and at most 86400 (one day)."
    )
    assert [m.msg for m in checks.check_settings()] == [str(raised.value)]


@pytest.mark.parametrize("number", [NAN, INF, -0.1, 61])
def test_the_worker_reads_no_flush_interval_the_check_refuses(settings, number):
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = number
    with pytest.raises(ConfigurationError, match="DEBOUNCE_SUCCESS_FLUSH_INTERVAL="):
        debounce_settings.success_flush_interval  # noqa: B018


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e999", "86401"])
def test_poll_interval_option_refuses_what_the_setting_refuses(value):
    """``run_debounce_worker --poll-interval inf`` got past ``positive_float``."""
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        positive_float(value)
    assert str(raised.value) == (
        f"{value!r} must be a finite number of seconds greater than 0 and at most 86400 (one day)"
    )


def test_the_shared_parsers_accept_their_bounds():
    from django_debounce.conf.numbers import MAX_RETRIES_LIMIT, parse_count, parse_seconds

    assert parse_seconds(86400, name="X", low=0, high=86400, low_open=True) == 86400.0
    assert parse_seconds(0, name="X", low=0, high=60) == 0.0
    assert parse_count(MAX_RETRIES_LIMIT, name="X", low=0, high=MAX_RETRIES_LIMIT) == 10_000
    assert math.isclose(parse_seconds(0.25, name="X", low=0, high=1), 0.25)


# -- item 2: DEBOUNCE_MAX_RETRIES, one rule for the check and the enqueue ---------------


@pytest.mark.parametrize("value", [10_001, 10**30])
def test_max_retries_over_10000_fails_e009_as_it_fails_every_enqueue(settings, value):
    """E009 passed 10001, then every enqueue without its own max_retries raised."""
    settings.DEBOUNCE_MAX_RETRIES = value

    messages = checks.check_settings()

    assert [m.id for m in messages] == ["django_debounce.E009"]
    assert messages[0].msg == f"DEBOUNCE_MAX_RETRIES={value!r} must be an int from 0 to 10000."
    assert messages[0].hint
    with pytest.raises(ConfigurationError) as raised:
        debounce_settings.max_retries  # noqa: B018
    assert str(raised.value) == messages[0].msg


@pytest.mark.parametrize("value", [0, 3, 10_000])
def test_max_retries_from_0_to_10000_pass_the_check_and_the_enqueue(settings, value):
    settings.DEBOUNCE_MAX_RETRIES = value
    assert checks.check_settings() == []
    assert debounce_settings.max_retries == value
