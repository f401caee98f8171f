"""What the database router is told, and where one database per batch or message is required (decision 224).

A router of this file records every ``db_for_write`` call on ``Job`` and answers
``None`` (no opinion: the job stays in ``default``) unless the test gives it a
route. The two-database behaviour itself runs in
tests/processes/test_queues_in_two_databases.py, on two PostgreSQL databases.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS
from django.test import override_settings

from django_debounce import databases
from django_debounce.enqueueing.bulk import Call, enqueue_many
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job
from tests.testapp.tasks_queue_databases import in_a, in_b, window

pytestmark = pytest.mark.django_db


class RecordingRouter:
    """Record the hints of ``db_for_write`` on django_debounce's models; route by ``ROUTES``."""

    seen: list[dict[str, Any]] = []
    routes: dict[str, str] = {}

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        if model._meta.app_label != "django_debounce":
            return None
        self.seen.append({"model": model.__name__, **hints})
        return self.routes.get(hints.get("queue") or "")


@pytest.fixture
def recorder() -> Iterator[type[RecordingRouter]]:
    RecordingRouter.seen, RecordingRouter.routes = [], {}
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.RecordingRouter"]):
        yield RecordingRouter


def test_the_router_is_told_the_queue_and_task_of_each_new_job(recorder) -> None:
    first = in_a.delay(1)
    moved = in_a.apply_async((2,), queue="sco_b")  # the call's queue, not the task's
    slid = window.delay("k")
    hints = [h for h in recorder.seen if "queue" in h]
    assert hints == [
        {"model": "Job", "queue": "sco_a", "task_name": "sco.a"},
        {"model": "Job", "queue": "sco_b", "task_name": "sco.a"},
        {"model": "Job", "queue": "sco_b", "task_name": "sco.window"},
    ]
    assert {first._state.db, moved._state.db, slid._state.db} == {DEFAULT_DB_ALIAS}


def test_a_window_handle_asks_the_router_with_the_task_s_queue(recorder) -> None:
    window.delay("k")
    recorder.seen.clear()
    assert window.window_for("w:k").pending() is True  # the resolved key
    assert {"model": "Job", "queue": "sco_b", "task_name": "sco.window"} in recorder.seen


def test_enqueue_many_refuses_calls_the_router_sends_to_two_databases(recorder) -> None:
    recorder.routes = {"sco_b": "queue_b"}  # not even configured: refused before any SQL
    with pytest.raises(ConfigurationError) as caught:
        enqueue_many([Call(in_a, (1,)), Call(in_b, (2,))])
    assert str(caught.value) == (
        "enqueue_many: the database router sends these calls to ['default', 'queue_b']; one "
        "batch is one transaction in one database: split the batch by database, or give using=."
    )
    assert not Job.objects.filter(task_name__startswith="sco.").exists()
    # One database for the whole batch is fine, and using= decides without asking.
    jobs = enqueue_many([Call(in_a, (1,)), Call(in_b, (2,))], using=DEFAULT_DB_ALIAS)
    assert [(j.task_name, j.args, j._state.db) for j in jobs] == [
        ("sco.a", [1], "default"),
        ("sco.b", [2], "default"),
    ]


def test_the_default_database_is_the_router_s_choice_without_hints(recorder) -> None:
    assert databases.default() == DEFAULT_DB_ALIAS
    assert databases.for_job("sco_a", "sco.a") == DEFAULT_DB_ALIAS
    recorder.routes = {"sco_b": "queue_b"}
    assert databases.for_job("sco_b", "sco.b") == "queue_b"
    assert recorder.seen[-1] == {"model": "Job", "queue": "sco_b", "task_name": "sco.b"}


def test_a_celery_message_names_the_database_only_when_it_is_not_the_default() -> None:
    from django_debounce.contrib.celery.routing import message_args

    job = in_a.delay(1)
    assert message_args(job) == [job.pk]
    job._state.db = "queue_b"  # as a claim on that database loads it
    assert message_args(job) == [job.pk, "queue_b"]


def test_a_message_naming_an_unknown_database_is_ignored_and_logged(caplog) -> None:
    from django_debounce.contrib.celery import tasks

    job = in_a.delay(1)
    with caplog.at_level(logging.ERROR, logger="django_debounce.celery"):
        assert tasks._job_and_database((job.pk, "nope"), {}) is None
    assert [r.action for r in caplog.records] == ["bad_message"]  # type: ignore[attr-defined]
    assert "of database 'nope': not an alias of this process's DATABASES ['default']" in (
        caplog.records[0].getMessage()
    )
    assert tasks._job_and_database((job.pk, "default"), {}) == (job.pk, "default")
    assert tasks._job_and_database((job.pk,), {}) == (job.pk, "default")
    job.refresh_from_db()
    assert job.status == Job.Status.READY  # nothing was taken
