"""Views the reliability tests call through the test client (B20, ``ATOMIC_REQUESTS``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from tests.testapp.models import Order
from tests.testapp.tasks_reliability import process_order


def enqueue_then_fail(request: HttpRequest) -> HttpResponse:
    """Create an order, enqueue its processing, then fail: a 500."""
    order = Order.objects.create(name=request.GET["name"])
    process_order.delay(order.pk)
    raise RuntimeError("the view failed after enqueueing")


def enqueue_ok(request: HttpRequest) -> HttpResponse:
    """Create an order and enqueue its processing; answer the job id."""
    order = Order.objects.create(name=request.GET["name"])
    job = process_order.delay(order.pk)
    return HttpResponse(str(job.pk))


urlpatterns = [
    path("enqueue-then-fail/", enqueue_then_fail, name="rel-enqueue-then-fail"),
    path("enqueue-ok/", enqueue_ok, name="rel-enqueue-ok"),
]
