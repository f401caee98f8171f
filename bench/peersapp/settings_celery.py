"""``bench.peersapp.settings`` with every task on the Celery executor (``bench/celery_drain.py``)."""

from __future__ import annotations

from bench.peersapp.settings import *  # noqa: F403

DEBOUNCE_EXECUTOR = "celery"
DEBOUNCE_CELERY_APP = "bench.peersapp.celery_executor_app.app"
DEBOUNCE_CELERY_QUEUES = {"default": "executor-bench"}
