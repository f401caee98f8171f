from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from django_debounce.contrib.prometheus.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rel/", include("tests.views")),
    # Unprotected here (tests only); docs/howto/metrics.md shows how a project protects it.
    path("metrics/", metrics_view),
]
