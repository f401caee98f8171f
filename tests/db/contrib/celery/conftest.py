"""Fixtures of the Celery executor's database tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_debounce.contrib.celery.batched_successes import process_successes


@pytest.fixture(autouse=True)
def _successes_written() -> Iterator[None]:
    """Write the successes a test's Celery task left waiting, and close the writer's connections.

    The test database is flushed or dropped next; the writer thread must not hold a
    session to it (decision 215).
    """
    yield
    process_successes.stop()
