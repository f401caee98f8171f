"""Argument types shared by the package's management commands.

Each parses one command-line string and raises ``argparse.ArgumentTypeError``
with a message naming the value, which ``BaseCommand`` reports as a usage error.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..conf.numbers import MAX_POLL_INTERVAL, seconds_range


def _integer(value: str, minimum: int, maximum: int | None = None) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
    if maximum is not None and number > maximum:
        raise argparse.ArgumentTypeError(f"{value!r} must be at most {maximum}")
    return number


def positive_int(value: str) -> int:
    """Parse an integer >= 1 (e.g. ``--concurrency``)."""
    return _integer(value, 1)


def bounded_int(maximum: int) -> Callable[[str], int]:
    """Return an argument type parsing an integer from 1 to ``maximum`` (e.g. ``--top``).

    A number the database cannot take as a ``LIMIT`` (``--top 99999999999999999999``)
    is a usage error, not a driver's traceback (decision 164).
    """

    def parse(value: str) -> int:
        return _integer(value, 1, maximum)

    parse.__name__ = f"int from 1 to {maximum}"  # argparse names the type in its messages
    return parse


def non_negative_int(value: str) -> int:
    """Parse an integer >= 0 (e.g. ``--limit``)."""
    return _integer(value, 0)


def positive_float(value: str) -> float:
    """Parse ``--poll-interval``: finite seconds > 0, at most a day, like ``DEBOUNCE_POLL_INTERVAL``.

    ``nan``, ``inf`` and ``1e999`` (a float's infinity) are refused (decision 162).
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(number) and 0 < number <= MAX_POLL_INTERVAL):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be {seconds_range(0, MAX_POLL_INTERVAL, low_open=True)}"
        )
    return number
