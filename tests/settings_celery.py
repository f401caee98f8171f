"""Settings of the Celery executor's subprocesses: the test settings plus what the test sets.

A test starts ``celery worker`` and ``run_debounce_worker --dispatch-only`` with
``DJANGO_SETTINGS_MODULE=tests.settings_celery`` and passes its choices in
the environment: the executor (``DEBOUNCE_TEST_EXECUTOR``), its own Celery
queue (``DEBOUNCE_TEST_CELERY_QUEUE``: every debounce queue publishes there) and
lease lengths (``DEBOUNCE_TEST_LEASE``, ``DEBOUNCE_TEST_HANDOFF_LEASE``).
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

DEBOUNCE_CELERY_APP = "tests.celery_app.app"
DEBOUNCE_EXECUTOR = os.environ.get("DEBOUNCE_TEST_EXECUTOR", "worker")
DEBOUNCE_LEASE = os.environ.get("DEBOUNCE_TEST_LEASE", "60s")
DEBOUNCE_CELERY_HANDOFF_LEASE = os.environ.get("DEBOUNCE_TEST_HANDOFF_LEASE", "5m")
DEBOUNCE_MIN_BACKOFF = os.environ.get("DEBOUNCE_TEST_MIN_BACKOFF", "1s")
if os.environ.get("DEBOUNCE_TEST_CELERY_QUEUE"):
    DEBOUNCE_CELERY_QUEUES = dict.fromkeys(
        ("default", "mail", "other"), os.environ["DEBOUNCE_TEST_CELERY_QUEUE"]
    )
