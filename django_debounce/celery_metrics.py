"""The path a Celery app's module names: ``django_debounce.celery_metrics.add_worker_metrics``.

A face kept for that path; the code lives in :mod:`django_debounce.contrib.celery.metrics`.
"""

from __future__ import annotations

from .contrib.celery.metrics import add_worker_metrics

__all__ = ["add_worker_metrics"]
