"""The Celery app of ``bench/celery_drain.py``: the Celery executor's worker, on the bench's Redis.

``celery -A bench.peersapp.celery_executor_app worker`` with
``DJANGO_SETTINGS_MODULE=bench.peersapp.settings_celery``: Django is set up
when this module loads, so the package's ``django_debounce.run_job`` task is
registered before the worker consumes.
"""

from __future__ import annotations

import os

import django
from celery import Celery

from . import counter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peersapp.settings_celery")

app = Celery("executor-bench", broker=counter.BROKER)
app.conf.update(
    task_ignore_result=True,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("DEBOUNCE_BENCH_DB_REUSE_MAX"):
    # Celery's Django fixup closes every database connection before and after each task
    # unless this is set; then it closes them every 2 x N tasks.
    app.conf.CELERY_DB_REUSE_MAX = int(os.environ["DEBOUNCE_BENCH_DB_REUSE_MAX"])
app.set_current()
app.set_default()
django.setup()
