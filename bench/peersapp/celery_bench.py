"""The Celery side of ``bench/peers.py``: an app on Redis and its no-op task.

Configured for Celery's fastest honest drain of fire-and-forget tasks: results
ignored (no result backend write), early acks (the default), no events,
default prefetch. The broker is ``DEBOUNCE_PEERS_REDIS`` (never database 0), or
``DEBOUNCE_BENCH_BROKER`` when set (``bench/scale_out.py``: RabbitMQ).
"""

from __future__ import annotations

from celery import Celery

from . import counter

app = Celery("peers", broker=counter.BROKER)
app.conf.update(
    task_ignore_result=True,
    task_default_queue="peers",
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.peers.celery_noop")  # type: ignore[untyped-decorator]
def noop(n: int) -> None:
    """Do nothing but count: the drain's job."""
    counter.hit()
