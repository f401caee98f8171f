"""A Django view serving the Prometheus metrics (issue #11 item 1; docs/howto/metrics.md).

Mount it in the project's URLconf, behind protection (the page names every
task and queue and their backlog)::

    from django_debounce.metrics_views import metrics_view
    urlpatterns = [path("metrics/", protect(metrics_view))]

The docs show protections: a bearer token checked by a small decorator, an
IP allow-list at the proxy, or a separate internal-only URLconf.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...conf import settings
from .metrics import exposition_registry


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Answer with the metrics in Prometheus' text format (``prometheus_client.CONTENT_TYPE_LATEST``).

    The counts of this process, or of every process of the host when
    ``PROMETHEUS_MULTIPROC_DIR`` is set, and the database gauges read now
    (:func:`django_debounce.contrib.prometheus.metrics.exposition_registry`). GET and HEAD only
    (Django's ``require_safe``; other methods: 405); the response is never
    cached. The view does no access control: wrap it.

    With ``DEBOUNCE_METRICS = False`` the view answers 404 with a one-line
    text body and reads nothing, as the worker refuses ``--metrics-port``
    (decision 131).
    """
    if settings.metrics is False:
        return HttpResponseNotFound(
            "metrics are off (DEBOUNCE_METRICS = False)\n", content_type="text/plain"
        )
    body = generate_latest(exposition_registry())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


__all__ = ["metrics_view"]
