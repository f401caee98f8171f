"""How a long-running loop waits out a database outage (``db_errors.ReconnectBackoff``).

The built-in worker's loop and the Celery dispatcher's share it: the delays
docs/reference/commands.md promises (1 s, 2 s, … up to 30 s, from the start
again after a round that worked), one ERROR line per failed round on the
loop's own logger, and the connection closed so the next round reconnects.
"""

from __future__ import annotations

import logging
from unittest import mock

from django.db import OperationalError

from django_debounce.db_errors import ReconnectBackoff


def test_the_delay_doubles_from_one_second_to_thirty_and_starts_again_after_a_round_that_worked():
    backoff = ReconnectBackoff("the loop", logger=logging.getLogger("t"), using="default")
    error = OperationalError("server closed the connection")
    assert [backoff.failed(error) for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    backoff.succeeded()
    assert backoff.failed(error) == 1


def test_each_failed_round_is_one_error_line_on_the_loops_logger_and_closes_the_connection(
    caplog,
):
    backoff = ReconnectBackoff(
        "the dispatcher", logger=logging.getLogger("django_debounce.celery"), using="default"
    )
    with (
        mock.patch("django_debounce.db_errors.connections") as connections,
        caplog.at_level(logging.ERROR, logger="django_debounce"),
    ):
        backoff.failed(OperationalError("gone"))
    connections.__getitem__.assert_called_once_with("default")
    connections["default"].close.assert_called_once_with()
    [record] = caplog.records
    assert (record.name, record.levelname, record.action) == (
        "django_debounce.celery",
        "ERROR",
        "db_error",
    )
    assert record.getMessage() == "database error in the dispatcher (gone); reconnecting in 1.0s"
