"""The path a project's ``urls.py`` names: ``django_debounce.metrics_views.metrics_view``.

A face kept for that path; the view lives in :mod:`django_debounce.contrib.prometheus.views`.
"""

from __future__ import annotations

from .contrib.prometheus.views import metrics_view

__all__ = ["metrics_view"]
