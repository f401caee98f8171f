"""The Celery app of the Celery executor's tests: a real ``celery worker`` runs it.

``python -m celery -A tests.celery_app worker -Q <queue> …`` with
``DJANGO_SETTINGS_MODULE=tests.settings_celery``. The broker is the
environment's ``DEBOUNCE_TEST_BROKER`` (default: the local Redis, database 12);
each test publishes to a Celery queue of its own (``DEBOUNCE_TEST_CELERY_QUEUE``),
so tests sharing a broker never take each other's messages.
"""

from __future__ import annotations

import os

import django
from celery import Celery

from django_debounce.contrib.celery.metrics import add_worker_metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_celery")

#: The local Redis; a test database of its own (bench/peers.py flushes 9, never touch 0).
REDIS = "redis://127.0.0.1:6379/12"
#: The local RabbitMQ's default vhost and user.
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def make_app(broker: str) -> Celery:
    """Return a Celery app on ``broker`` configured as the tests need (no results, no events)."""
    celery = Celery("tests", broker=broker, set_as_current=False)
    celery.conf.update(
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=3,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        task_acks_late=False,
    )
    return celery


def with_results(celery: Celery, prefix: str) -> Celery:
    """Store task results in the local Redis (database 12) under keys starting with ``prefix``."""
    celery.conf.update(
        result_backend=REDIS,
        result_backend_transport_options={"global_keyprefix": prefix},
        task_ignore_result=False,
    )
    return celery


app = make_app(os.environ.get("DEBOUNCE_TEST_BROKER", REDIS))
if os.environ.get("DEBOUNCE_TEST_DEFAULT_QUEUE"):  # a plain worker, no -Q, no queue mapping
    app.conf.task_default_queue = os.environ["DEBOUNCE_TEST_DEFAULT_QUEUE"]
if os.environ.get("DEBOUNCE_TEST_RESULT_PREFIX"):  # a test reading AsyncResult states
    with_results(app, os.environ["DEBOUNCE_TEST_RESULT_PREFIX"])
app.set_current()
app.set_default()
# `celery worker --debounce-metrics-port N` (tests/processes/contrib/celery/test_celery_metrics.py); called
# before Django is set up, as in a project's proj/celery.py.
add_worker_metrics(app)
# Load Django (and through it the package's Celery tasks and the test tasks) now, so the
# worker knows every task before it consumes a message.
django.setup()
