"""Why a READY job waits (``django_debounce.flow.hold_reasons`` and the job page's "held back by" line),
"why it ran when it did" for jobs that did not run, and the read-only flow-control pages
(TaskState, QueueState) of the admin (issue #4 follow-ups from a new user's trial).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_debounce.claim import task_states
from django_debounce.claim.claiming import claim_jobs
from django_debounce.flow import hold_reasons as holds
from django_debounce.flow.rules import current_gates
from django_debounce.models import DeadLetter, Job, JobDependency, QueueState, TaskState
from tests.conftest import T
from tests.db.admin.test_admin import staff, url
from tests.factories import DeadLetterFactory, JobFactory
from tests.testapp import tasks_admin_holds

pytestmark = pytest.mark.django_db

LEASE = dt.timedelta(minutes=5)


@pytest.fixture
def holds_tasks():
    tasks = tasks_admin_holds.register()
    yield tasks
    tasks_admin_holds.unregister()


def codes(job: Job) -> list[str]:
    return [hold.code for hold in holds.held_back(job)]


def texts(job: Job) -> list[str]:
    return [hold.text for hold in holds.held_back(job)]


def running(task_name: str, lease_until: dt.datetime, **fields: Any) -> Job:
    return JobFactory(
        task_name=task_name, status=Job.Status.RUNNING, lease_expires_at=lease_until, **fields
    )


def claimed_ids() -> set[int]:
    return {job.pk for job in claim_jobs(worker_id="w", limit=50, lease=LEASE)}


# -- holds.held_back mirrors the claim ---------------------------------------------------


def test_a_due_free_job_has_no_hold_and_is_claimed(clock):
    job = JobFactory()
    assert holds.held_back(job) == []
    assert claimed_ids() == {job.pk}
    job.refresh_from_db()
    assert holds.held_back(job) == []  # not READY: no holds


def test_not_due_and_expired(clock):
    later = JobFactory(run_at=T + dt.timedelta(minutes=5))
    assert holds.held_back(later) == [
        holds.Hold("not_due", "not due until 2026-03-01 12:05:00", until=later.run_at)
    ]
    stale = JobFactory(expires_at=T - dt.timedelta(seconds=1))
    assert texts(stale) == ["expired at 2026-03-01 11:59:59: the next claim ends it EXPIRED, unrun"]
    assert claimed_ids() == set()
    stale.refresh_from_db()
    assert stale.status == Job.Status.EXPIRED


def test_dependency_not_yet_successful(clock):
    first = JobFactory(run_at=T + dt.timedelta(minutes=1))
    then = JobFactory()
    JobDependency.objects.create(job=then, dependency=first)
    (hold,) = holds.held_back(then)
    assert (hold.code, hold.text, hold.job_id) == (
        "dependency",
        f"dependency not yet successful: #{first.pk} (READY)",
        first.pk,
    )
    assert claimed_ids() == set()
    Job.objects.filter(pk=first.pk).update(status=Job.Status.SUCCESSFUL)
    assert holds.held_back(then) == []
    assert claimed_ids() == {then.pk}


def test_another_run_of_the_key_in_flight_or_ahead(clock):
    live = running("tests.noop", T + dt.timedelta(minutes=1), key_hash="k1")
    waiting = JobFactory(key_hash="k1")
    (hold,) = holds.held_back(waiting)
    assert (hold.code, hold.text, hold.job_id) == (
        "key",
        f"another run of its key in flight: #{live.pk}",
        live.pk,
    )
    earlier = JobFactory(key_hash="k2", run_at=T - dt.timedelta(seconds=5))
    behind = JobFactory(key_hash="k2")
    assert texts(behind) == [f"an earlier job of its key is due ahead of it: #{earlier.pk}"]
    assert holds.held_back(earlier) == []
    assert claimed_ids() == {earlier.pk}  # one run per key at a time (§4.5)
    clock(minutes=2)  # the running job's lease lapsed: no longer in flight
    assert holds.held_back(waiting) == []


def test_circuit_breaker_open_until_reset_then_probe(clock, holds_tasks):
    TaskState.objects.create(
        task_name="holds.guarded", breaker_state="open", failures=2, opened_at=T
    )
    job = JobFactory(task_name="holds.guarded")
    clock(seconds=10)
    (hold,) = holds.held_back(job)
    assert hold.code == "breaker" and hold.until == T + dt.timedelta(minutes=1)
    assert hold.text == (
        "circuit breaker open until 2026-03-01 12:01:00 (2 consecutive failures); "
        "then one job runs as the probe"
    )
    assert claimed_ids() == set()
    clock(seconds=60)  # reset passed: the next claim admits one probe
    assert holds.held_back(job) == []
    assert claimed_ids() == {job.pk}
    other = JobFactory(task_name="holds.guarded")
    (hold,) = holds.held_back(other)  # half-open, the probe is running
    assert (hold.code, hold.job_id) == ("probe", job.pk)
    assert hold.text == f"circuit breaker half-open: probe #{job.pk} is running"
    assert claimed_ids() == set()


def test_concurrency_cap_full(clock, holds_tasks):
    running("holds.capped", T + dt.timedelta(minutes=1))
    running("holds.capped", T + dt.timedelta(minutes=2))
    running("holds.capped", T - dt.timedelta(seconds=1))  # lease lapsed: not counted
    job = JobFactory(task_name="holds.capped")
    assert texts(job) == ["concurrency cap full (2/2 running)"]
    assert claimed_ids() == set()
    clock(seconds=61)
    assert holds.held_back(job) == []
    assert claimed_ids() == {job.pk}


def test_no_token_until(clock, holds_tasks):
    TaskState.objects.create(task_name="holds.rated", tokens=0.0, tokens_at=T)
    job = JobFactory(task_name="holds.rated")
    clock(seconds=15)  # 2/m: half a token now, a whole one at T+30s
    (hold,) = holds.held_back(job)
    assert (hold.code, hold.until) == ("rate_limit", T + dt.timedelta(seconds=30))
    assert hold.text == "no token until ~2026-03-01 12:00:30 (rate limit 2/m)"
    assert claimed_ids() == set()
    clock(seconds=30)
    assert holds.held_back(job) == []
    assert claimed_ids() == {job.pk}


def test_drop_mode_without_a_token_says_it_will_be_shed(clock, holds_tasks):
    TaskState.objects.create(task_name="holds.dropped", tokens=0.0, tokens_at=T)
    job = JobFactory(task_name="holds.dropped")
    assert texts(job) == [
        "no token (rate limit 1/m, on_excess='drop'): a claim before ~2026-03-01 12:01:00 sheds it"
    ]
    assert claimed_ids() == set()
    job.refresh_from_db()
    assert job.status == Job.Status.SHED


def test_unknown_task_is_said(clock):
    job = JobFactory(task_name="gone.task")
    assert codes(job) == ["unknown_task"]


def test_every_hold_is_listed_in_order(clock, holds_tasks):
    TaskState.objects.create(
        task_name="holds.guarded", breaker_state="open", failures=2, opened_at=T
    )
    dep = JobFactory(run_at=T + dt.timedelta(hours=1))
    job = JobFactory(task_name="holds.guarded", run_at=T + dt.timedelta(seconds=5))
    JobDependency.objects.create(job=job, dependency=dep)
    assert codes(job) == ["not_due", "dependency", "breaker"]


# -- the job page ------------------------------------------------------------------------


def test_job_page_shows_held_back_by_with_bounded_queries(
    admin_client, clock, holds_tasks, django_assert_max_num_queries
):
    TaskState.objects.create(
        task_name="holds.guarded", breaker_state="open", failures=2, opened_at=T
    )
    live = running("holds.guarded", T + dt.timedelta(minutes=1), key_hash="g")
    job = JobFactory(task_name="holds.guarded", key_hash="g")
    with django_assert_max_num_queries(20):
        html = admin_client.get(url("job", "change", job.pk)).content.decode()
    assert "Held back by:" in html
    assert "circuit breaker open until 2026-03-01 12:01:00" in html
    link = url("job", "change", live.pk)
    assert f'another run of its key in flight: <a href="{link}">#{live.pk}</a>' in html
    free = JobFactory()
    html = admin_client.get(url("job", "change", free.pk)).content.decode()
    assert "nothing: it is due and free to run; a worker serving queue default claims it" in html


# -- why it ran when it did, for jobs that did not run --------------------------------------


def why(admin_client: Any, job: Job) -> str:
    response = admin_client.get(url("job", "change", job.pk))
    field = response.context["adminform"]
    for fieldset in field:
        for line in fieldset:
            for f in line:
                if f.field["name"] == "why_it_ran":
                    return str(f.contents())
    raise AssertionError("no why_it_ran field")


def test_why_for_ready_shed_expired_and_cancelled(admin_client, clock):
    assert why(admin_client, JobFactory(run_at=T + dt.timedelta(minutes=2))) == (
        "has not run yet (due 2026-03-01 12:02:00)"
    )
    retrying = JobFactory(attempts=1, run_at=T + dt.timedelta(seconds=8), error="E: x")
    assert why(admin_client, retrying) == (
        "waiting for a retry (attempt 2 due 2026-03-01 12:00:08): an earlier attempt failed "
        "or its worker stopped; see error"
    )
    shed = JobFactory(status=Job.Status.SHED, finished_at=T)
    DeadLetterFactory(job=shed, reason="shed: rate limit 10/s exceeded")
    assert why(admin_client, shed) == "never ran: shed by the rate limit 10/s exceeded"
    dropped = JobFactory(status=Job.Status.SHED, finished_at=T)
    DeadLetterFactory(job=dropped, reason="codel: waited 7.0s, over target 5s")
    assert why(admin_client, dropped) == "never ran: shed by CoDel (waited 7.0s, over target 5s)"
    expired = JobFactory(status=Job.Status.EXPIRED, expires_at=T, finished_at=T)
    assert why(admin_client, expired) == (
        "never ran: expired at 2026-03-01 12:00:00 (not started by its expiry)"
    )
    cancelled = JobFactory(status=Job.Status.CANCELLED, finished_at=T)
    assert why(admin_client, cancelled) == "never ran: cancelled at 2026-03-01 12:00:00"
    failed = JobFactory(status=Job.Status.FAILED, attempts=1)
    orphan = JobFactory(status=Job.Status.CANCELLED, finished_at=T)
    JobDependency.objects.create(job=orphan, dependency=failed)
    assert why(admin_client, orphan) == (
        f"never ran: cancelled at 2026-03-01 12:00:00 because job #{failed.pk} it depends on "
        "ended FAILED"
    )
    gave_up = JobFactory(status=Job.Status.CANCELLED, attempts=2, finished_at=T)
    assert why(admin_client, gave_up) == (
        "did not run again after 2 attempts: cancelled at 2026-03-01 12:00:00"
    )
    assert not DeadLetter.objects.filter(job=expired).exists()


# -- flow-control state pages ----------------------------------------------------------------


def test_task_state_page_shows_state_now(admin_client, clock, holds_tasks):
    TaskState.objects.create(
        task_name="holds.guarded", breaker_state="open", failures=2, opened_at=T
    )
    probe = running("holds.capped", T + dt.timedelta(minutes=1))
    running("holds.capped", T - dt.timedelta(seconds=1))  # lapsed lease: not counted
    TaskState.objects.create(
        task_name="holds.capped", breaker_state="half_open", probe_job_id=probe.pk
    )
    TaskState.objects.create(task_name="holds.rated", tokens=0.0, tokens_at=T)
    TaskState.objects.create(task_name="gone.task")
    clock(seconds=15)
    response = admin_client.get(url("taskstate"))
    assert response.status_code == 200
    cl = response.context["cl"]
    rows = {state.task_name: state for state in cl.result_list}
    admin = cl.model_admin
    assert [admin.breaker(rows[n]) for n in ("holds.guarded", "holds.rated")] == [
        "Open",
        "none declared",
    ]
    assert admin.reset_due_at(rows["holds.guarded"]) == "2026-03-01 12:01:00"
    assert admin.tokens_now(rows["holds.rated"]) == (
        "0.50 / 2 (2/m) · next token ~2026-03-01 12:00:30"
    )
    assert admin.tokens_now(rows["holds.guarded"]) == "no rate limit"
    assert admin.tokens_now(rows["gone.task"]) == "task not registered here"
    assert admin.running_vs_cap(rows["holds.capped"]) == "1 / 2"
    assert admin.running_vs_cap(rows["holds.rated"]) == "0 / no cap"
    html = response.content.decode()
    assert f'<a href="{url("job", "change", probe.pk)}">#{probe.pk}</a>' in html
    detail = admin_client.get(url("taskstate", "change", "holds.rated"))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert "0.000 @ 2026-03-01 12:00:00" in detail.content.decode()


def test_task_state_page_says_when_rows_appear(admin_client, clock, holds_tasks):
    """Empty, the page explains itself; a worker's first claim makes the rows of the gated tasks
    it knows, before its transaction (decision 148), whichever job it finds due."""
    empty = "No task states yet: no worker has claimed since a task with a rate limit"
    task_states.forget()  # this process's claims made them for an earlier, rolled-back test
    page = admin_client.get(url("taskstate")).content.decode()
    assert "A task's row is created by the first claim a worker makes" in page
    assert empty in page
    assert TaskState.objects.count() == 0

    JobFactory(task_name="tests.noop")
    JobFactory(task_name="holds.rated", run_at=T + dt.timedelta(minutes=1))  # not due yet
    assert claimed_ids() != set()  # the plain job
    rows = dict(TaskState.objects.values_list("task_name", "tokens"))
    assert set(rows) == set(current_gates()) >= set(holds_tasks)
    assert set(rows.values()) == {None}  # full buckets: nothing was taken
    page = admin_client.get(url("taskstate")).content.decode()
    assert empty not in page and "A task's row is created" in page
    # A search that finds nothing is not "no rows yet".
    assert empty not in admin_client.get(url("taskstate") + "?q=holds.none").content.decode()


def test_queue_state_page(admin_client, clock):
    QueueState.objects.create(
        queue="mail", dropping=True, drop_count=3, drop_next_at=T, first_above_at=T
    )
    response = admin_client.get(url("queuestate"))
    (state,) = response.context["cl"].result_list
    admin = response.context["cl"].model_admin
    assert (state.queue, state.dropping, state.drop_count) == ("mail", True, 3)
    assert admin.next_drop(state) == "2026-03-01 12:00:00"
    assert admin_client.get(url("queuestate", "change", "mail")).status_code == 200


@pytest.mark.parametrize("model", ["taskstate", "queuestate"])
def test_state_pages_are_view_only(admin_client, client, django_user_model, model):
    obj = (
        TaskState.objects.create(task_name="holds.x")
        if model == "taskstate"
        else QueueState.objects.create(queue="q")
    )
    assert admin_client.get(url(model, "add")).status_code == 403
    page = admin_client.get(url(model))
    assert b'value="delete_selected"' not in page.content
    assert admin_client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    detail = admin_client.get(url(model, "change", obj.pk))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert admin_client.post(url(model, "change", obj.pk), {}).status_code == 403
    assert type(obj).objects.count() == 1
    client.force_login(staff(django_user_model, "view_job"))
    assert client.get(url(model)).status_code == 403
    client.force_login(staff(django_user_model, f"view_{model}"))
    assert client.get(url(model)).status_code == 200


def _seed_states(rows: int, start: int) -> None:
    TaskState.objects.bulk_create(
        TaskState(task_name=f"holds.t{n:03d}", tokens=1.0, tokens_at=T, failures=n)
        for n in range(start, start + rows)
    )
    QueueState.objects.bulk_create(
        QueueState(queue=f"q{n:03d}") for n in range(start, start + rows)
    )
    for n in range(start, start + rows):
        running(f"holds.t{n:03d}", T + dt.timedelta(minutes=1))


@pytest.mark.parametrize("model", ["taskstate", "queuestate"])
def test_state_pages_queries_do_not_grow_with_rows(admin_client, clock, model):
    counts = []
    for rows, start in ((5, 0), (60, 5)):
        _seed_states(rows, start)
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(url(model))
        assert response.status_code == 200
        counts.append(len(queries))
    assert len(response.context["cl"].result_list) == 50
    assert counts[0] == counts[1] <= 10, counts
