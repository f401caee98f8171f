"""The admin says which run of a burst a job is (issue #21 item 4, decisions 180 and 197).

Window 10 s, max wait 60 s, under the frozen clock; the jobs are written by real
calls and run by the real worker (``burst``).
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_debounce import debounced_task
from django_debounce.models import Job
from django_debounce.ops import edge_runs

pytestmark = pytest.mark.django_db
WINDOW = {"debounce": "10s", "debounce_max_wait": "60s", "debounce_key": "doc:{doc}"}


@debounced_task(name="adm_edge.leading", debounce_edge="leading", queue="adm-edge", **WINDOW)
def leading(doc, revision=0):
    """Leading edge."""


@debounced_task(name="adm_edge.both", debounce_edge="both", queue="adm-edge", **WINDOW)
def both(doc, revision=0):
    """Both edges."""


@debounced_task(name="adm_edge.trailing", queue="adm-edge", **WINDOW)
def trailing(doc, revision=0):
    """The default, trailing edge."""


def cells(html: str, column: str) -> list[str]:
    return [c.strip() for c in re.findall(rf'class="field-{column}">(?:<a [^>]*>)?([^<]*)<', html)]


def detail(admin_client, pk: int) -> str:
    html = admin_client.get(reverse("admin:django_debounce_job_change", args=[pk])).content
    text = html.decode()
    found = re.search(r'<div class="readonly">([^<]*(?:leading|trailing) run[^<]*)</div>', text)
    assert found, "no edge line on the job's page"
    return found.group(1).replace("&#x27;", "'")


def test_both_burst_shows_its_leading_and_trailing_runs(admin_client, clock, burst):
    first = both.delay(1, revision=0)
    burst()  # the leading run, at T
    clock(seconds=3)
    second = both.delay(1, revision=1)
    clock(seconds=5)
    assert both.delay(1, revision=2).pk == second.pk
    other = trailing.delay(2)
    assert (first.status, Job.objects.get(pk=first.pk).status) == ("READY", "SUCCESSFUL")
    assert [edge_runs.run_edge(Job.objects.get(pk=p)) for p in (first.pk, second.pk, other.pk)] == [
        "leading",
        "trailing",
        "trailing",
    ]

    jobs = admin_client.get(reverse("admin:django_debounce_job_changelist"), {"queue": "adm-edge"})
    rows = dict(
        zip(cells(jobs.content.decode(), "id"), cells(jobs.content.decode(), "edge"), strict=True)
    )
    assert rows == {str(first.pk): "leading", str(second.pk): "trailing", str(other.pk): "trailing"}
    windows = admin_client.get(reverse("admin:django_debounce_openwindow_changelist"))
    html = windows.content.decode()
    assert sorted(zip(cells(html, "job"), cells(html, "edge"), strict=True)) == sorted(
        [(f"#{second.pk}", "trailing"), (f"#{other.pk}", "trailing")]
    )

    assert detail(admin_client, first.pk).startswith(
        "leading run (debounce_edge='both'): the burst's first call, due at once"
    )
    assert detail(admin_client, second.pk) == (
        "trailing run (debounce_edge='both'): 2 calls after the burst's leading run collapsed "
        "into it (2026-03-01 12:00:03 to 2026-03-01 12:00:05)"
    )
    assert detail(admin_client, other.pk) == (
        "trailing run: 1 call collapsed into it (2026-03-01 12:00:05 to 2026-03-01 12:00:05)"
    )


def test_leading_burst_says_how_many_calls_it_swallowed(admin_client, clock, burst):
    job = leading.delay(1, revision=0)
    for at in (2, 4):
        clock(seconds=at)
        assert leading.delay(1, revision=at).pk == job.pk
    burst()
    ran = Job.objects.get(pk=job.pk)
    assert (ran.status, ran.kwargs, ran.enqueue_count) == ("SUCCESSFUL", {"revision": 0}, 3)
    assert detail(admin_client, job.pk) == (
        "leading run (debounce_edge='leading'): the burst's first call, due at once; 2 later "
        "calls were swallowed (last 2026-03-01 12:00:04)"
    )


def test_a_job_of_a_task_this_process_does_not_know_has_no_edge(clock):
    job = both.delay(1)
    Job.objects.filter(pk=job.pk).update(task_name="adm_edge.gone")
    assert edge_runs.run_edge(Job.objects.get(pk=job.pk)) is None
    assert edge_runs.run_edge(Job.objects.get(pk=trailing.delay(3).pk)) == "trailing"


def test_the_edge_costs_the_page_one_exists_per_row_and_the_count_none(admin_client, clock):
    for doc in range(3):
        both.delay(doc)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:django_debounce_job_changelist"))
    assert page.status_code == 200
    sql = [
        q["sql"].upper()
        for q in queries.captured_queries
        if "DJANGO_DEBOUNCE_JOB" in q["sql"].upper()
    ]
    counts = [q for q in sql if q.startswith("SELECT COUNT(*)")]
    assert counts and not any("EXISTS" in q for q in counts)
    assert len([q for q in sql if "EXISTS" in q]) == 1  # the page's rows, one statement
