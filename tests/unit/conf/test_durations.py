"""Durations (contract §2): seconds, timedelta, and "250ms"/"10s"/"5m"/"2h"/"1d"/"1h30m"."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_debounce import debounced_task, task
from django_debounce.conf.durations import parse_duration
from django_debounce.exceptions import ConfigurationError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (10, timedelta(seconds=10)),
        (1, timedelta(seconds=1)),
        (2.5, timedelta(seconds=2.5)),
        (0.001, timedelta(milliseconds=1)),
        (timedelta(minutes=3), timedelta(minutes=3)),
        (timedelta(microseconds=1), timedelta(microseconds=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("10s", timedelta(seconds=10)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
        ("1.5s", timedelta(seconds=1.5)),
        ("90s", timedelta(seconds=90)),
        ("500ms", timedelta(milliseconds=500)),
        (" 10s ", timedelta(seconds=10)),
    ],
)
def test_accepted_durations(value, expected):
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "0s",
        "0ms",
        "-1m",
        "5 minutes",
        "5min",
        "10",
        "",
        "ms",
        "1m30",
        "s10",
        "10x",
        0,
        0.0,
        -1,
        -0.5,
        float("nan"),
        float("inf"),
        timedelta(0),
        timedelta(seconds=-1),
        True,
        False,
        None,
        [10],
        b"10s",
    ],
)
def test_rejected_durations(value):
    with pytest.raises(ConfigurationError) as info:
        parse_duration(value, name="debounce")
    assert isinstance(info.value, ValueError)
    # The message names the option and the offending value.
    assert "debounce=" in str(info.value)


def test_error_message_shows_the_accepted_forms():
    with pytest.raises(ConfigurationError, match=r"'250ms', '10s', '5m', '2h', '1d' or '1h30m'"):
        parse_duration("5 minutes")


@pytest.mark.parametrize(
    ("debounce", "max_wait", "window", "ceiling"),
    [
        ("250ms", "1h30m", timedelta(milliseconds=250), timedelta(minutes=90)),
        (10, 60.5, timedelta(seconds=10), timedelta(seconds=60.5)),
        (timedelta(minutes=5), "1d", timedelta(minutes=5), timedelta(days=1)),
        ("2h", "2h", timedelta(hours=2), timedelta(hours=2)),
    ],
)
def test_decorators_take_every_duration_form(debounce, max_wait, window, ceiling):
    @debounced_task(debounce=debounce, debounce_max_wait=max_wait)
    def f(x):
        return x

    assert f.options.debounce == window
    assert f.options.debounce_max_wait == ceiling


@pytest.mark.parametrize("bad", ["0s", "-1m", "5 minutes", 0, -1, True, [1]])
@pytest.mark.parametrize("option", ["debounce", "debounce_max_wait", "expires", "min_backoff"])
def test_decorators_reject_bad_durations(option, bad):
    options = {"debounce": "10s", "debounce_max_wait": "1m", option: bad}
    with pytest.raises(ConfigurationError, match=option):

        @task(**options)
        def f(x):
            return x


def test_none_debounce_max_wait_is_required_without_default():
    with pytest.raises(ConfigurationError, match="debounce_max_wait"):

        @debounced_task(debounce="10s", debounce_max_wait=None)
        def f(x):
            return x


@pytest.mark.parametrize("value", ["١٠s", "１０s", "1.٥s", "1h३०m", "٥ms", "𝟙𝟘s"])
def test_only_ascii_digits_make_a_duration(value):
    """``"١٠s"`` (Arabic-Indic digits) read as 10 s: ``\\d`` and ``float()`` take any
    Unicode decimal digit (issue #17 follow-up 5; decision 166)."""
    with pytest.raises(ConfigurationError) as raised:
        parse_duration(value, name="debounce")
    assert str(raised.value) == (
        f"debounce={value!r} is not a duration: write its numbers with the ASCII digits "
        "0-9, e.g. '10s' or '1h30m'."
    )


@pytest.mark.parametrize("value", ["١٠/s", "５/m", "1/١٠s"])
def test_only_ascii_digits_make_a_rate(value):
    from django_debounce.rates import parse_rate

    with pytest.raises(ConfigurationError, match=r"^rate_limit=.* is not a rate"):
        parse_rate(value)


@pytest.mark.parametrize(("value", "expected"), [(" 10s ", 10), ("10S", 10), ("1H30M", 5400)])
def test_surrounding_spaces_and_upper_case_units_are_still_read(value, expected):
    assert parse_duration(value) == timedelta(seconds=expected)
