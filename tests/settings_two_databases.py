"""The Celery test settings plus a second database, ``queue_b``, and ``tests.queue_router``.

For the subprocesses of tests/processes/test_queues_in_two_databases.py: the second
database is the test database's server and settings under the name
``DEBOUNCE_TEST_SECOND_DB`` (the test creates and drops it).
"""

from __future__ import annotations

import os

from tests.settings_celery import *  # noqa: F403

DATABASES["queue_b"] = {  # noqa: F405
    **DATABASES["default"],  # noqa: F405
    "NAME": os.environ["DEBOUNCE_TEST_SECOND_DB"],
    "TEST": {"NAME": os.environ["DEBOUNCE_TEST_SECOND_DB"]},
}
DATABASE_ROUTERS = ["tests.queue_router.QueueRouter"]
os.environ["DEBOUNCE_SCO_RATED"] = "1"  # register the gated sco.rated (read at app load)
if os.environ.get("DEBOUNCE_TEST_CELERY_QUEUE"):  # the rig's one Celery queue takes both
    DEBOUNCE_CELERY_QUEUES = dict.fromkeys(
        ("sco_a", "sco_b"), os.environ["DEBOUNCE_TEST_CELERY_QUEUE"]
    )
