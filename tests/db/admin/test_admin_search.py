"""The admin's exact, index-served search (issue #4: changelists stay fast with 1M jobs).

Django's ``=field`` search compares ``UPPER(field)`` (and casts ids to text),
which no index serves; the jobs and dead-letter changelists search exactly
instead: ids by primary key, task names by the ``task_name`` indexes, debounce
keys by ``key_hash`` (the hash of task name and key, for registered tasks).
How fast that is at 1M rows is measured by ``bench/admin_changelists.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from django_debounce.keys import window_hash
from django_debounce.models import Job
from tests.factories import DeadLetterFactory, JobFactory
from tests.testapp.tasks_admin import refresh

pytestmark = pytest.mark.django_db


def found(client: Any, model: str, term: str) -> list[int]:
    response = client.get(reverse(f"admin:django_debounce_{model}_changelist"), {"q": term})
    assert response.status_code == 200
    return [row.pk for row in response.context["cl"].result_list]


def keyed(key: str, task_name: str = "tests.admin.refresh", **fields: Any) -> Job:
    """A job of ``task_name`` with debounce key ``key``, its ``key_hash`` as an enqueue writes it."""
    return JobFactory(
        task_name=task_name, debounce_key=key, key_hash=window_hash(task_name, key), **fields
    )


def test_job_search_matches_id_key_and_task_name_exactly(admin_client):
    plain = JobFactory(task_name="tests.admin.mail")
    spaced = keyed("page 42 de")
    other = keyed("page:7")
    assert found(admin_client, "job", str(plain.pk)) == [plain.pk]
    assert found(admin_client, "job", "  page 42 de ") == [spaced.pk]  # one term, spaces kept
    assert found(admin_client, "job", "page:7") == [other.pk]
    assert found(admin_client, "job", "tests.admin.mail") == [plain.pk]
    assert found(admin_client, "job", "page") == []  # exact, not a substring
    # Exact and case-sensitive on every database, MariaDB's case-insensitive collation included.
    assert found(admin_client, "job", "TESTS.ADMIN.MAIL") == []
    assert found(admin_client, "job", "Tests.admin.mail") == []
    assert found(admin_client, "job", "PAGE:7") == []


def test_job_search_finds_a_key_whatever_job_of_it(admin_client):
    first = keyed("page:1", status=Job.Status.SUCCESSFUL)
    second = keyed("page:1")
    assert found(admin_client, "job", "page:1") == [second.pk, first.pk]


def test_job_search_finds_keys_of_registered_tasks_only(admin_client):
    """The key is looked up by its hash per registered task: a task gone from the code is not."""
    keyed("page:9", task_name="tests.admin.removed_task")
    assert found(admin_client, "job", "page:9") == []
    assert found(admin_client, "job", "tests.admin.removed_task") != []  # its name still is


@pytest.mark.parametrize("term", ["12a", "-3", "99999999999999999999999", "½", "1.5"])
def test_job_search_with_a_term_that_is_not_an_id_matches_nothing(admin_client, term):
    JobFactory()
    assert found(admin_client, "job", term) == []


def test_dead_letter_search_matches_id_original_job_and_task_name(admin_client):
    letter = DeadLetterFactory()
    other = DeadLetterFactory(task_name="tests.admin.mail")
    for number in (letter.pk, other.job_id):  # ids of two sequences: they may coincide
        expected = [dl.pk for dl in (other, letter) if number in (dl.pk, dl.job_id)]
        assert found(admin_client, "deadletter", str(number)) == expected
    assert other.pk in found(admin_client, "deadletter", str(other.job_id))
    assert found(admin_client, "deadletter", "tests.admin.mail") == [other.pk]
    assert found(admin_client, "deadletter", "tests.admin") == []
    assert found(admin_client, "deadletter", "TESTS.ADMIN.MAIL") == []  # case-sensitive


def test_open_windows_search_stays_a_substring_search(admin_client):
    job = refresh.delay(42)
    assert found(admin_client, "openwindow", "ge:4") == [job.pk]
    assert found(admin_client, "job", "ge:4") == []


@pytest.mark.parametrize("term", ["9" * 5000, str(2**63), "²", "١", "0"])
def test_a_numeric_term_that_is_no_id_is_searched_as_text(admin_client, term):
    """Out of the bigint range, or no ASCII digits: no id lookup (5,000 digits was HTTP 500)."""
    JobFactory()
    DeadLetterFactory()
    assert found(admin_client, "job", term) == []
    assert found(admin_client, "deadletter", term) == []
    if len(term) <= 255:  # a task name of digits is found by its text
        job = JobFactory(task_name=term)
        letter = DeadLetterFactory(task_name=term)
        assert found(admin_client, "job", term) == [job.pk]
        assert found(admin_client, "deadletter", term) == [letter.pk]


def test_a_long_numeric_debounce_key_is_found_by_its_text(admin_client):
    job = keyed("9" * 4000)
    assert found(admin_client, "job", "9" * 4000) == [job.pk]
