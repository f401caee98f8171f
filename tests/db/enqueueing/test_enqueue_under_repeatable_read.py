"""An enqueue that loses a race inside a REPEATABLE READ transaction fails fast (issue #8).

At REPEATABLE READ (or SERIALIZABLE) PostgreSQL shows a transaction only the rows
committed before its first statement, its locking reads included. A coalescing call
(``unique_key``) that loses its insert to a job committed after that can never find
the job, so every retry inside the transaction loses again: before, the call spent
its whole retry budget (20 attempts, about 3.9 s of back-off) before giving up. Two
real connections: the test's (the loser) and a producer thread's (the winner).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_debounce import task
from django_debounce.exceptions import EnqueueContentionError
from django_debounce.models import Job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@task(name="snapshot.charge", unique_key="charge:{0}")
def charge(order: int) -> None:
    """Coalesce calls per order."""


def in_other_connection(call: Any) -> Any:
    """Run ``call`` in a thread, on that thread's own connection (autocommit); return its result."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(call())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert out, "the other connection's call did not return"
    return out[0]


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_losing_coalescing_call_in_a_fixed_snapshot_fails_fast(level):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        assert Job.objects.count() == 0  # the snapshot is taken here
        winner = in_other_connection(lambda: charge.delay(7))  # committed after it
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(EnqueueContentionError, match="REPEATABLE READ or SERIALIZABLE"):
                charge.delay(7)
        inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
        assert len(inserts) == 1  # one attempt, not the whole retry budget
    assert list(Job.objects.values_list("pk", "unique_key")) == [(winner.pk, "charge:7")]


def test_at_read_committed_the_losing_call_still_coalesces():
    with transaction.atomic():
        assert Job.objects.count() == 0
        winner = in_other_connection(lambda: charge.delay(8))
        loser = charge.delay(8)
    assert (loser.pk, loser.outcome) == (winner.pk, "coalesced")
    assert Job.objects.count() == 1
