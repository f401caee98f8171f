"""Run now / Cancel on open windows (``django_debounce.ops.windows`` and the admin actions), and the
admin's races on PostgreSQL and MariaDB: a job claimed meanwhile is refused, two Retry clicks
retry once.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client
from django.urls import reverse

from django_debounce.claim.claiming import claim_jobs
from django_debounce.models import DeadLetter, Job, JobDependency, TaskState
from django_debounce.ops import windows
from tests.conftest import T, child_env
from tests.db.admin.test_admin import messages_of, staff
from tests.factories import DeadLetterFactory, JobFactory
from tests.procs import processes, wait_for, waiting_on_a_lock
from tests.testapp import tasks_admin_holds
from tests.testapp.models import CallLog
from tests.testapp.tasks_admin import refresh
from tests.testapp.tasks_common import record

LEASE = dt.timedelta(minutes=5)

LIST = reverse("admin:django_debounce_openwindow_changelist")
JOBS = reverse("admin:django_debounce_job_changelist")


def action(client: Client, name: str, *ids: int, changelist: str = LIST) -> Any:
    data = {"action": name, "index": "0", "_selected_action": [str(i) for i in ids]}
    return client.post(changelist, data, follow=True)


# -- windows module ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_now_makes_the_window_due_and_keeps_it_open(clock, burst):
    job = refresh.delay(1)
    clock(seconds=4)
    result = windows.run_now([job.pk])
    assert result == windows.WindowActionResult(done=[job.pk], refused=[])
    job.refresh_from_db()
    assert job.run_at == T + dt.timedelta(seconds=4)
    assert job.max_run_at == T + dt.timedelta(minutes=1)  # the ceiling does not move
    assert job.is_open_window  # open until claimed (§4.1)
    burst()
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL


@pytest.mark.django_db
def test_a_call_after_run_now_still_joins_and_slides(clock):
    job = refresh.delay(1)
    clock(seconds=4)
    windows.run_now([job.pk])
    assert refresh.delay(1).pk == job.pk
    job.refresh_from_db()
    assert (job.enqueue_count, job.run_at) == (2, T + dt.timedelta(seconds=14))


@pytest.mark.django_db
def test_run_now_never_moves_a_due_window_later(clock):
    job = refresh.delay(1)
    clock(seconds=30)  # due since T+10s, not claimed: still open
    windows.run_now([job.pk])
    job.refresh_from_db()
    assert job.run_at == T + dt.timedelta(seconds=10)  # keeps its place in line


@pytest.mark.django_db
def test_cancel_closes_the_window_and_cancels_dependents(clock, signal_log):
    job = refresh.delay(1)
    child = JobFactory()
    grandchild = JobFactory()
    JobDependency.objects.create(job=child, dependency=job)
    JobDependency.objects.create(job=grandchild, dependency=child)
    clock(seconds=2)
    result = windows.cancel([job.pk, job.pk])
    assert result.done == [job.pk] and result.refused == []
    assert result.cancelled_dependents == [child.pk, grandchild.pk]
    job.refresh_from_db()
    assert (job.status, job.window_key, job.finished_at) == (
        Job.Status.CANCELLED,
        None,
        T + dt.timedelta(seconds=2),
    )
    assert not DeadLetter.objects.exists()  # a planned outcome (§8)
    assert [entry[0] for entry in signal_log] == ["job_enqueued"]  # no signal for a cancel
    assert set(
        Job.objects.filter(pk__in=[child.pk, grandchild.pk]).values_list("status", flat=True)
    ) == {Job.Status.CANCELLED}
    fresh = refresh.delay(1)  # the key's next call opens a new window
    assert fresh.pk != job.pk and fresh.outcome == "created"


@pytest.mark.django_db
def test_window_actions_refuse_what_is_not_an_open_window(clock):
    finished = JobFactory(status=Job.Status.SUCCESSFUL)
    refresh.delay(1)
    claimed = refresh.delay(2)
    clock(seconds=10)
    ran = claim_jobs(worker_id="w", limit=10, lease=dt.timedelta(minutes=1))
    assert claimed.pk in {job.pk for job in ran}
    window = refresh.delay(3)
    for act in (windows.run_now, windows.cancel):
        result = act([claimed.pk, finished.pk, window.pk, 10**9])
        assert result.done == [window.pk]
        assert result.refused == sorted([claimed.pk, finished.pk, 10**9])
        assert (result.running, result.finished, result.missing) == (
            [claimed.pk],
            {finished.pk: "SUCCESSFUL"},
            [10**9],
        )
    claimed.refresh_from_db()
    assert claimed.status == Job.Status.RUNNING and claimed.run_at == T + dt.timedelta(seconds=10)


@pytest.mark.django_db
def test_window_actions_reject_bad_ids_before_writing():
    job = refresh.delay(1)
    with pytest.raises(TypeError, match="job ids must be ints"):
        windows.cancel([job.pk, "7"])  # type: ignore[list-item]
    job.refresh_from_db()
    assert job.status == Job.Status.READY


# -- admin actions ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_run_now_and_cancel(admin_client, clock):
    a = refresh.delay(1)
    b = refresh.delay(2)
    clock(seconds=1)
    response = action(admin_client, "run_now", a.pk)
    assert messages_of(response) == ["1 open window made due now."]
    a.refresh_from_db()
    assert a.run_at == T + dt.timedelta(seconds=1)
    response = action(admin_client, "cancel", a.pk, b.pk)
    assert messages_of(response) == ["2 open windows cancelled."]
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.CANCELLED}
    assert list(response.context["cl"].result_list) == []


@pytest.mark.django_db
def test_admin_actions_refuse_a_job_claimed_meanwhile(admin_client, clock):
    """The operator selected a window on the page; a worker claimed it before the click."""
    job = refresh.delay(1)
    other = refresh.delay(2)
    page = admin_client.get(LIST)
    assert f'value="{job.pk}"'.encode() in page.content  # selectable on the page
    clock(seconds=10)
    claim_jobs(worker_id="w", limit=1, lease=dt.timedelta(minutes=1))  # claims job (lower id)
    for name in ("run_now", "cancel"):
        response = action(admin_client, name, job.pk)
        assert messages_of(response) == [
            f"1 job refused: a worker claimed it meanwhile (it is running): #{job.pk}."
        ]
    job.refresh_from_db()
    assert (job.status, job.run_at) == (Job.Status.RUNNING, T + dt.timedelta(seconds=10))
    response = action(admin_client, "cancel", job.pk, other.pk)
    assert messages_of(response)[0] == "1 open window cancelled."
    assert "refused" in messages_of(response)[1]


@pytest.mark.django_db
def test_window_actions_need_change_job_permission(client, django_user_model):
    job = refresh.delay(1)
    viewer = staff(django_user_model, "view_openwindow", "view_job")
    client.force_login(viewer)
    page = client.get(LIST)
    assert page.status_code == 200 and b'value="cancel"' not in page.content
    action(client, "cancel", job.pk)  # forged
    job.refresh_from_db()
    assert job.status == Job.Status.READY
    operator = staff(django_user_model, "view_openwindow", "change_job")
    client.force_login(operator)
    assert b'value="cancel"' in client.get(LIST).content
    action(client, "cancel", job.pk)
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED


@pytest.mark.django_db
def test_job_changelist_acts_on_every_ready_job(admin_client):
    """On Jobs, Run now / Cancel act on any unclaimed READY job, window or not."""
    job = refresh.delay(1)
    plain = JobFactory()
    response = action(admin_client, "cancel", job.pk, plain.pk, changelist=JOBS)
    assert messages_of(response) == ["2 jobs cancelled."]
    plain.refresh_from_db()
    assert plain.status == Job.Status.CANCELLED


# -- any READY job, not only open windows ---------------------------------------------------


@pytest.fixture
def holds_tasks():
    tasks = tasks_admin_holds.register()
    yield tasks
    tasks_admin_holds.unregister()


def waiting_jobs() -> dict[str, Job]:
    """READY jobs that are not open windows: an eta job, a retry waiting out its backoff."""
    return {
        "eta": JobFactory(run_at=T + dt.timedelta(hours=1)),
        "retry": JobFactory(
            attempts=1, run_at=T + dt.timedelta(seconds=30), error="builtins.ValueError: x"
        ),
    }


@pytest.mark.django_db
def test_run_now_and_cancel_act_on_ready_jobs_that_are_not_windows(clock):
    jobs = waiting_jobs()
    window = refresh.delay(1)
    ids = [job.pk for job in jobs.values()] + [window.pk]
    clock(seconds=2)
    result = windows.run_now(ids)
    assert result.done == sorted(ids) and result.refused == []
    for job in [*jobs.values(), window]:
        job.refresh_from_db()
        assert job.run_at == T + dt.timedelta(seconds=2)
    assert window.is_open_window  # decision 54: the window stays open
    result = windows.cancel(ids)
    assert result.done == sorted(ids)
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.CANCELLED}


@pytest.mark.django_db
def test_only_open_windows_refuses_a_ready_job_that_is_no_longer_a_window(clock):
    retry = JobFactory(attempts=1, run_at=T + dt.timedelta(seconds=30))
    for act in (windows.run_now, windows.cancel):
        result = act([retry.pk], only_open_windows=True)
        assert (result.done, result.refused, result.not_window) == ([], [retry.pk], [retry.pk])
    retry.refresh_from_db()
    assert (retry.status, retry.run_at) == (Job.Status.READY, T + dt.timedelta(seconds=30))


@pytest.mark.django_db
def test_jobs_page_run_now_says_flow_control_still_applies(admin_client, clock, holds_tasks):
    TaskState.objects.create(
        task_name="holds.guarded", breaker_state="open", failures=2, opened_at=T
    )
    held = JobFactory(task_name="holds.guarded", run_at=T + dt.timedelta(minutes=5))
    eta = JobFactory(run_at=T + dt.timedelta(hours=1))
    clock(seconds=10)
    response = action(admin_client, "run_now", held.pk, eta.pk, changelist=JOBS)
    assert messages_of(response) == [
        "2 jobs made due now.",
        "Run now does not bypass flow control: task holds.guarded has a circuit breaker, "
        "applied when a worker claims it; right now its circuit breaker is open until "
        f"2026-03-01 12:01:00. Waiting there: #{held.pk}.",
    ]
    assert {job.pk for job in claim_jobs(worker_id="w", limit=5, lease=LEASE)} == {eta.pk}
    held.refresh_from_db()
    assert (held.status, held.run_at) == (Job.Status.READY, T + dt.timedelta(seconds=10))


@pytest.mark.django_db
def test_jobs_page_refusals_say_which_claimed_and_which_finished(admin_client, clock):
    claimed = JobFactory()
    done = JobFactory(status=Job.Status.SUCCESSFUL)
    shed = JobFactory(status=Job.Status.SHED)
    ready = JobFactory(run_at=T + dt.timedelta(minutes=1))
    page = admin_client.get(JOBS)
    assert f'value="{claimed.pk}"'.encode() in page.content
    claim_jobs(worker_id="w", limit=1, lease=LEASE)  # claims the only due job
    ids = (claimed.pk, done.pk, shed.pk, ready.pk)
    response = action(admin_client, "cancel", *ids, changelist=JOBS)
    assert messages_of(response) == [
        "1 job cancelled.",
        f"1 job refused: a worker claimed it meanwhile (it is running): #{claimed.pk}.",
        f"2 jobs refused: they already finished: #{done.pk} (successful), #{shed.pk} (shed).",
    ]
    claimed.refresh_from_db()
    assert claimed.status == Job.Status.RUNNING


@pytest.mark.django_db
def test_open_windows_page_refuses_a_job_now_waiting_for_a_retry(admin_client):
    retry = JobFactory(attempts=1)  # was a window, claimed, failed: READY for its retry
    response = action(admin_client, "cancel", retry.pk)
    assert messages_of(response) == [
        "1 job refused: it is no longer an open window (a worker claimed it meanwhile and it "
        f"now waits for a retry; act on it from the Jobs page): #{retry.pk}."
    ]
    retry.refresh_from_db()
    assert retry.status == Job.Status.READY


@pytest.mark.django_db
def test_jobs_page_actions_need_change_job_permission(client, django_user_model):
    job = JobFactory(run_at=T + dt.timedelta(hours=1))
    client.force_login(staff(django_user_model, "view_job"))
    assert b'value="cancel"' not in client.get(JOBS).content
    action(client, "cancel", job.pk, changelist=JOBS)  # forged
    action(client, "run_now", job.pk, changelist=JOBS)
    job.refresh_from_db()
    assert (job.status, job.run_at) == (Job.Status.READY, T + dt.timedelta(hours=1))


# -- races on a server database (PostgreSQL, MariaDB) ---------------------------------------


def _claim_in_open_transaction(job_id: int, claimed: threading.Event, release: threading.Event):
    """A worker's claim that has locked and updated the row but not committed yet."""
    try:
        with transaction.atomic():
            Job.objects.select_for_update().filter(pk=job_id).get()
            Job.objects.filter(pk=job_id).update(
                status=Job.Status.RUNNING, window_key=None, worker_id="slow-claimer"
            )
            claimed.set()
            assert release.wait(30)
    finally:
        connections.close_all()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("act", ["run_now", "cancel"])
def test_action_waits_for_a_claim_in_flight_and_refuses_it(act):
    job = refresh.delay(1)
    claimed, release = threading.Event(), threading.Event()
    claimer = threading.Thread(target=_claim_in_open_transaction, args=(job.pk, claimed, release))
    claimer.start()
    try:
        assert claimed.wait(30)
        box: dict[str, Any] = {}

        def operator() -> None:
            try:
                box["result"] = getattr(windows, act)([job.pk])
            finally:
                connections.close_all()

        op = threading.Thread(target=operator)
        op.start()
        wait_for(
            waiting_on_a_lock,
            timeout=30,
            interval=0.25,
            what="the action to wait on the claim's row lock",
        )
        release.set()
        op.join(30)
        assert not op.is_alive()
    finally:
        release.set()
        claimer.join(30)
    assert box["result"].done == [] and box["result"].refused == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.worker_id) == (Job.Status.RUNNING, "slow-claimer")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_two_admins_retrying_at_once_retry_once(django_user_model):
    letter = DeadLetterFactory()
    users = [staff(django_user_model, "view_deadletter", "retry_deadletter") for _ in range(2)]
    barrier = threading.Barrier(2)
    jobs_before = Job.objects.count()

    results: list[Any] = []

    def click(user: Any) -> None:
        try:
            client = Client()
            client.force_login(user)
            barrier.wait(30)
            data = {"action": "retry_selected", "index": "0", "_selected_action": [str(letter.pk)]}
            response = client.post(reverse("admin:django_debounce_deadletter_changelist"), data)
            assert response.status_code == 302
            # Read the page, not response.context: the test client collects contexts through
            # a process-wide signal, so two threads rendering at once could swap them.
            page = client.get(response["Location"]).content.decode()
            results.append(re.findall(r'<li class="(?:success|warning)">([^<]*)</li>', page))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2
    texts = sorted(r[0].split(":")[0] for r in results)
    assert texts == [
        "0 dead letters retried, 1 skipped (already retried).",
        "1 dead letter retried, 0 skipped (already retried)",
    ]
    assert Job.objects.count() == jobs_before + 1
    letter.refresh_from_db()
    assert letter.retry_job_id is not None


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_cancel_racing_a_worker_cancels_or_refuses_never_both(tmp_path):
    """Cancel on plain READY jobs while a real worker process claims them (newest first
    against the worker's oldest first, so they meet): each job is either cancelled and never
    runs, or refused because it was claimed, and then it ran. Never both, never neither."""
    jobs = [record.delay(n) for n in range(120)]
    ids = [job.pk for job in jobs]
    by_arg = {n: job.pk for n, job in enumerate(jobs)}
    cancelled: set[int] = set()
    refused: set[int] = set()
    with processes(tmp_path, child_env()) as procs:
        procs.worker("--concurrency", "2", "--poll-interval", "0.02")
        wait_for(
            lambda: CallLog.objects.filter(task="tests.record").exists(),
            timeout=60,
            what=lambda: f"the worker's first run\n{procs.tails()}",
        )
        for end in range(len(ids), 0, -4):
            result = windows.cancel(ids[max(0, end - 4) : end])
            cancelled.update(result.done)
            refused.update(result.refused)
        wait_for(
            lambda: (
                not Job.objects.filter(status__in=[Job.Status.READY, Job.Status.RUNNING]).exists()
            ),
            timeout=120,
            what=lambda: f"every job to finish or be cancelled\n{procs.tails()}",
        )
    ran = [by_arg[log.payload["args"][0]] for log in CallLog.objects.filter(task="tests.record")]
    assert len(ran) == len(set(ran))  # nothing ran twice
    assert cancelled | refused == set(ids) and not cancelled & refused
    assert not cancelled & set(ran)  # a cancelled job never ran
    assert refused == set(ran)  # a refused job had been claimed, and it ran
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert {statuses[pk] for pk in cancelled} <= {Job.Status.CANCELLED}
    assert {statuses[pk] for pk in refused} == {Job.Status.SUCCESSFUL}
