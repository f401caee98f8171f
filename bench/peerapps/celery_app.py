"""The Celery peer: an app on Redis (``DEBOUNCE_PEERS_REDIS``), results ignored, early acks.

The same configuration as ``bench/peersapp/celery_bench.py`` (Celery's fastest
honest fire-and-forget drain), plus the ``stamp`` task of the idle latency.
"""

from __future__ import annotations

from celery import Celery

from bench.peersapp import counter

from . import stamps

app = Celery("peer", broker=counter.URL)
app.conf.update(
    task_ignore_result=True,
    task_default_queue="peer",
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="peer.noop")
def noop(n: int) -> None:
    """Do nothing but count: the drain's job."""
    counter.hit()


@app.task(name="peer.stamp")
def stamp(tag: str) -> None:
    """Record the start time: the idle-latency job."""
    stamps.push(tag)
