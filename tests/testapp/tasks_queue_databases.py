"""Tasks of the queues-in-two-databases tests (tests/processes/test_queues_in_two_databases.py).

``sco.a`` waits in queue ``sco_a`` (the default database), ``sco.b`` in ``sco_b``, which
``tests.queue_router.QueueRouter`` sends to the second database; ``sco.rated`` has a rate
limit (a ``TaskState`` bucket row per database) and ``sco.window`` a debounce window. Each
returns its argument, so a job's stored result names the payload that ran.
"""

from __future__ import annotations

import os

from django_debounce import debounced_task, task


@task(name="sco.a", queue="sco_a")
def in_a(n: int) -> int:
    """Return ``n``."""
    return n


@task(name="sco.b", queue="sco_b")
def in_b(n: int) -> int:
    """Return ``n``."""
    return n


def rated(n: int) -> int:
    """Return ``n`` (a rate-limited task: its bucket is a ``TaskState`` row)."""
    return n


# A gated task sends every claim of its process through the flow-control gate, so
# ``sco.rated`` is registered only where ``DEBOUNCE_SCO_RATED=1``: the subprocesses of
# ``tests.settings_two_databases``, never the test suite's own process.
if os.environ.get("DEBOUNCE_SCO_RATED") == "1":
    rated = task(name="sco.rated", queue="sco_a", rate_limit="1000/s")(rated)


@task(name="sco.fails", queue="sco_b", max_retries=0)
def fails(n: int) -> None:
    """Raise: its one attempt ends in a dead letter of the second database."""
    raise RuntimeError(f"sco.fails {n}")


@debounced_task(
    name="sco.window",
    queue="sco_b",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="w:{0}",
)
def window(key: str) -> str:
    """Return ``key`` (a window an hour long: it never runs in the test)."""
    return key
