"""The Celery executor's hand-off, in one process: claim, take, lapse, run, publish (issue #10).

The real ``celery worker`` runs are tests/processes/contrib/celery/test_celery_executor.py;
here the hand-off's database side is checked under the frozen clock.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from django_debounce.claim.claiming import claim_jobs
from django_debounce.contrib.celery import executor as celery_executor
from django_debounce.contrib.celery import handoff
from django_debounce.exceptions import ConfigurationError, JobFailedError
from django_debounce.models import DeadLetter, Job
from django_debounce.registry import get_task
from django_debounce.run import leases
from django_debounce.tasks import Task, task
from tests.celery_app import REDIS, make_app
from tests.conftest import T, require_service
from tests.processes.celery_rig import broker_up
from tests.procs import wait_for
from tests.testapp.tasks_celery import bound, fails, on_worker, record, stacked

pytestmark = pytest.mark.django_db

Status = Job.Status
LEASE = dt.timedelta(seconds=30)


def _handoff(**options) -> list[Job]:
    return handoff.claim_for_handoff(scheduler_id="sched", limit=10, lease=LEASE, **options)


def test_each_executor_claims_only_its_own_tasks(clock, burst, settings):
    celery_job = record.delay("c")
    worker_job = on_worker.delay("w")
    burst()
    assert Job.objects.get(pk=celery_job.pk).status == Status.READY, "the worker left it alone"
    assert Job.objects.get(pk=worker_job.pk).status == Status.SUCCESSFUL
    assert [job.pk for job in _handoff()] == [celery_job.pk]

    settings.DEBOUNCE_EXECUTOR = "celery"  # now every task without executor= is Celery's
    plain = get_task("rel.one_query").apply_async(args=(1,))
    again = on_worker.delay("w2")
    assert [job.pk for job in _handoff()] == [plain.pk]
    assert [job.pk for job in claim_jobs(worker_id="w", limit=10, lease=LEASE)] == [again.pk]


def test_a_handoff_claim_marks_the_job_handed_off_not_started(clock):
    job = record.delay("h")
    (claimed,) = _handoff()
    row = Job.objects.get(pk=job.pk)
    assert row.status == Status.RUNNING and row.worker_id == "handoff:sched"
    assert (row.attempts, row.lease_expires_at) == (1, T + LEASE)
    assert claimed.pk == job.pk


def test_take_is_one_conditional_statement_that_only_one_message_wins(
    clock, django_assert_num_queries
):
    job = record.delay("t")
    _handoff()
    clock(seconds=5)
    # One UPDATE … RETURNING; MariaDB has no UPDATE … RETURNING: the row is read after it.
    with django_assert_num_queries(2 if connection.vendor == "mysql" else 1):
        taken = handoff.take(job.pk, worker_id="celery:a", lease=dt.timedelta(minutes=1))
    assert taken.job is not None and taken.why == ""
    assert (taken.job.worker_id, taken.job.started_at) == ("celery:a", T + dt.timedelta(seconds=5))
    assert taken.job.lease_expires_at == T + dt.timedelta(seconds=65)
    assert taken.job.attempts == 1, "the hand-off's attempt is this run's"
    duplicate = handoff.take(job.pk, worker_id="celery:b", lease=dt.timedelta(minutes=1))
    assert duplicate.job is None
    assert duplicate.why == "it is already running on celery:a"


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("lapsed", "its hand-off lease lapsed; the scheduler hands it off again"),
        ("reclaimed", "it is READY again (its hand-off lapsed); the scheduler hands it off again"),
        ("cancelled", "it is CANCELLED"),
        ("deleted", "the job no longer exists"),
        ("never", "it is READY again (its hand-off lapsed); the scheduler hands it off again"),
    ],
)
def test_a_message_with_nothing_to_take_is_a_no_op(clock, setup, why):
    job = record.delay("n")
    if setup != "never":
        _handoff()
    clock(seconds=31)
    if setup == "reclaimed":
        leases.reclaim_expired_leases()
    elif setup == "cancelled":
        Job.objects.filter(pk=job.pk).update(
            status=Status.CANCELLED, worker_id="", lease_expires_at=None
        )
    elif setup == "deleted":
        Job.objects.filter(pk=job.pk).delete()
    taken = handoff.take(job.pk, worker_id="celery:x", lease=LEASE)
    assert (taken.job, taken.why) == (None, why)
    assert celery_executor.run_handed_off(job.pk) is None


def test_a_lapsed_handoff_goes_back_without_spending_an_attempt(clock):
    job = get_task("cel.record").apply_async(args=("l",), max_retries=0)
    for _ in range(3):  # three publishes lost in a row: never a dead letter
        assert [j.pk for j in _handoff()] == [job.pk]
        clock(at=Job.objects.get(pk=job.pk).lease_expires_at)
        assert leases.reclaim_expired_leases() == (1, 0)
        row = Job.objects.get(pk=job.pk)
        assert (row.status, row.attempts, row.worker_id) == (Status.READY, 0, "")
    assert not DeadLetter.objects.exists()


def test_run_handed_off_runs_the_job_and_records_its_result(clock, signal_log):
    job = record.delay("r")
    _handoff()
    result = celery_executor.run_handed_off(job.pk)
    done = Job.objects.get(pk=job.pk)
    assert done.status == Status.SUCCESSFUL
    assert result == done.result and done.result["tag"] == "r"
    assert done.worker_id.startswith("celery:")
    assert [name for name, _, _ in signal_log] == ["job_enqueued", "job_started", "job_finished"]
    assert celery_executor.run_handed_off(job.pk) is None, "a late message is a no-op"


def test_a_handed_off_job_taken_past_its_expiry_ends_expired_unrun(clock, signal_log):
    """Issue #17 item 3 on Celery: a job that waited in the broker past its expiry never runs."""
    job = record.apply_async(args=("late",), expires="10s")
    dependent = record.apply_async(args=("after",), depends_on=[job])
    _handoff()
    clock(seconds=11)  # the message sat in the broker (the hand-off lease is 30 s)
    signal_log.clear()
    assert celery_executor.take_and_run(job.pk).job.status == Status.EXPIRED
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.started_at) == (Status.EXPIRED, 0, None)
    assert row.finished_at == T + dt.timedelta(seconds=11)
    assert Job.objects.get(pk=dependent.pk).status == Status.CANCELLED
    assert signal_log == [] and not DeadLetter.objects.exists()  # never started, planned (§8)


def test_a_failing_run_retries_with_the_tasks_backoff_then_dead_letters(clock):
    job = fails.delay("f")
    for attempt in (1, 2):
        _handoff()
        celery_executor.run_handed_off(job.pk)
        row = Job.objects.get(pk=job.pk)
        assert (row.status, row.attempts) == (Status.READY, attempt)
        assert row.run_at == clock(at=row.run_at)  # moved to the backoff's end...
        assert dt.timedelta(seconds=5) <= row.run_at - row.started_at <= dt.timedelta(seconds=10)
    _handoff()
    with pytest.raises(JobFailedError):
        celery_executor.run_handed_off(job.pk)
    assert Job.objects.get(pk=job.pk).status == Status.FAILED
    letter = DeadLetter.objects.get(job=job.pk)
    assert letter.error == "RuntimeError: no luck for f"


def test_a_failed_publish_leaves_the_job_handed_off_until_its_lease_lapses(settings):
    # Real time (kombu's connection retries read the clock); a publish to a closed port takes ~2 s.
    settings.DEBOUNCE_CELERY_HANDOFF_LEASE = "6s"
    broken = make_app("redis://127.0.0.1:1/0")  # nothing listens on port 1
    broken.conf.update(
        task_publish_retry=False,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        broker_connection_timeout=0.5,
    )
    job = record.delay("p")
    assert celery_executor.dispatch_due(app=broken) == 1
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker_id.startswith("handoff:")) == (Status.RUNNING, True)
    assert celery_executor.dispatch_due(app=broken) == 0, "not handed off twice while live"
    wait_for(
        lambda: celery_executor.dispatch_due(app=broken) == 1,
        timeout=30,
        what="the hand-off to lapse and the job to be handed off again",
    )
    assert Job.objects.get(pk=job.pk).attempts == 1, "a lost publish spends no attempt"


def test_a_stop_during_the_handoff_claim_puts_its_jobs_back_unpublished():
    """Decision 167: a SIGTERM that lands while the claim statement runs publishes nothing and
    leaves nothing handed off: the jobs go back to READY as before the claim, at once, not
    after their hand-off lease (processes: test_signals_at_every_phase_dispatcher.py)."""
    retried = record.delay("retried")
    earlier = T - dt.timedelta(minutes=5)
    Job.objects.filter(pk=retried.pk).update(attempts=1, started_at=earlier)
    jobs = [retried, record.delay("fresh")]
    fields = ("status", "attempts", "worker_id", "lease_expires_at", "started_at", "run_at")
    before = [Job.objects.filter(pk=job.pk).values(*fields).get() for job in jobs]
    stopping = threading.Event()

    def stop_in_the_claim(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "UPDATE" in sql.upper() and Job._meta.db_table in sql:  # the claim's marking write
            stopping.set()  # what the dispatcher's SIGTERM handler does
        return result

    app = make_app("redis://127.0.0.1:1/0")  # never reached: nothing is published
    with connection.execute_wrapper(stop_in_the_claim):
        assert celery_executor.dispatch_due(app=app, stopping=stopping) == 0
    assert stopping.is_set(), "the claim ran"
    assert [Job.objects.filter(pk=job.pk).values(*fields).get() for job in jobs] == before


def test_stacking_on_a_shared_task_routes_delay_through_the_window(clock):
    assert isinstance(stacked, Task) and stacked.name == "cel.stacked"
    assert stacked.options.executor == "celery"
    first = stacked.delay(key="a", n=1)
    second = stacked.apply_async(kwargs={"key": "a", "n": 2})
    assert (first.pk, first.outcome, second.outcome) == (second.pk, "created", "debounced")
    assert Job.objects.get(pk=first.pk).debounce_key == "stacked:a"
    assert stacked(key="inline", n=3) == "inline:3", "calling it runs the Celery task's body"


def test_stacking_on_a_bound_task_hides_self_from_callers(clock):
    job = bound.delay("k")
    assert Job.objects.get(pk=job.pk).debounce_key == "bound:k"
    clock(seconds=1)
    _handoff()
    assert celery_executor.run_handed_off(job.pk) == "cel.bound:k"


def test_an_unknown_executor_is_refused_at_registration():
    with pytest.raises(ConfigurationError, match=r"executor='thread' is not an executor"):
        task(name=f"t.{uuid.uuid4().hex}", executor="thread")(lambda: None)


def test_queues_map_to_celery_queues_and_default_to_the_apps_default_queue(settings):
    settings.DEBOUNCE_CELERY_QUEUES = {"mail": "celery-mail"}
    app = make_app(REDIS)
    assert celery_executor.celery_queue("mail", app=app) == "celery-mail"
    assert celery_executor.celery_queue("other", app=app) == "other"
    # Unlisted, the package's "default" queue is the one a plain `celery worker` consumes.
    assert celery_executor.celery_queue("default", app=app) == "celery"
    app.conf.task_default_queue = "jobs"
    assert celery_executor.celery_queue("default", app=app) == "jobs"
    settings.DEBOUNCE_CELERY_QUEUES = {"default": "mine"}
    assert celery_executor.celery_queue("default", app=app) == "mine"


@pytest.mark.django_db(transaction=True)
def test_dispatch_only_burst_publishes_each_due_job_with_its_id_as_task_id(settings):
    require_service(broker_up(REDIS), f"needs the local Redis at {REDIS}")
    queue = f"dbt-{uuid.uuid4().hex[:10]}"
    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    settings.DEBOUNCE_CELERY_QUEUES = {"default": queue}
    jobs = [record.delay(f"d{i}") for i in range(3)]
    app = make_app(REDIS)
    try:
        call_command("run_debounce_worker", dispatch_only=True, burst=True, stderr=StringIO())
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            messages = [channel.basic_get(queue, no_ack=True) for _ in range(4)]
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    assert messages[3] is None, "one message per job"
    ids = sorted(message.headers["id"] for message in messages[:3])
    assert ids == sorted(str(job.pk) for job in jobs)
    assert {message.headers["task"] for message in messages[:3]} == {"django_debounce.run_job"}
    assert {message.headers["eta"] for message in messages[:3]} == {None}
    assert set(Job.objects.values_list("status", flat=True)) == {Status.RUNNING}


def test_the_scheduler_runs_the_dead_letter_sweep(clock, settings, monkeypatch):
    from tests.db.ops.test_dead_letter_auto_retry import CONFIG, old_letter

    settings.DEBOUNCE_DEAD_LETTER_AUTO_RETRY = CONFIG
    monkeypatch.setattr(celery_executor._sweep_schedule, "next_at", None)  # this test's first round
    letter = old_letter()
    assert celery_executor.dispatch_due(app=make_app(REDIS)) == 0, "dep.step runs on the worker"
    letter.refresh_from_db()
    assert letter.retried_at == T and letter.retry_job is not None
    assert Job.objects.get(pk=letter.retry_job_id).status == Status.READY


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_idle_dispatcher_wakes_on_listen_notify_not_at_its_poll(settings):
    """A dispatcher with a 5 s poll hands a due-now job to Celery well within the poll."""
    import threading
    import time

    require_service(broker_up(REDIS), f"needs the local Redis at {REDIS}")
    queue = f"dbt-{uuid.uuid4().hex[:10]}"
    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    settings.DEBOUNCE_CELERY_QUEUES = {"default": queue}
    dispatcher = celery_executor.Dispatcher(poll_interval=5.0, handle_signals=False)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # the first (empty) round, then the LISTEN
        started = time.monotonic()
        job = record.delay("wake")
        handed = wait_for(
            lambda: Job.objects.filter(pk=job.pk, status=Status.RUNNING).first(),
            timeout=4.5,
            what="the hand-off",
        )
        elapsed = time.monotonic() - started
    finally:
        dispatcher.stop()
        thread.join(10)
        with make_app(REDIS).connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    assert handed.worker_id.startswith(leases.HANDOFF_PREFIX)
    assert elapsed < 1.0, f"handed off after {elapsed:.2f} s (poll 5 s)"
    assert dispatcher.dispatched == 1


def test_a_handoff_nobody_took_is_logged_as_never_taken_naming_the_celery_queue(
    clock, caplog, settings
):
    settings.DEBOUNCE_CELERY_QUEUES = {"mail": "mail-io"}
    job = get_task("cel.record").apply_async(args=("q",), queue="mail")
    _handoff()
    clock(at=Job.objects.get(pk=job.pk).lease_expires_at)
    with caplog.at_level("WARNING", logger="django_debounce"):
        assert leases.reclaim_expired_leases() == (1, 0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        f"job {job.pk} (cel.record) was handed off by sched and never taken: no Celery worker "
        "consumed Celery queue 'mail-io' within the hand-off lease (no worker on that queue, "
        "workers stopped or saturated, or the message lost); handed off again, its attempt "
        "not counted"
    )


def test_a_handoff_nobody_takes_is_reported_within_seconds_while_the_lease_holds(
    clock, caplog, settings
):
    """Decision 153: 10 s after the hand-off, not after the 5-minute lease; once per job."""
    from django_debounce.contrib.celery.handoff_watch import UntakenWatch

    settings.DEBOUNCE_CELERY_QUEUES = {"mail": "mail-io"}
    watch = UntakenWatch()
    lease = dt.timedelta(minutes=5)
    mail = get_task("cel.record").apply_async(args=("m",), queue="mail")
    busy = [get_task("cel.record").apply_async(args=(f"b{i}",), queue="other") for i in range(2)]
    handoff.claim_for_handoff(scheduler_id="sched", limit=10, lease=lease)
    # A worker consumes 'other' (it took one of its jobs): the other one waits, not unconsumed.
    assert handoff.take(busy[0].pk, worker_id="celery:w", lease=LEASE).job is not None

    def check() -> list[str]:
        return watch.check(lease=lease, route=celery_executor.celery_queue)

    clock(seconds=9)
    assert check() == []
    clock(seconds=11)
    with caplog.at_level("WARNING", logger="django_debounce.celery"):
        assert check() == [
            f"1 job(s) handed off 10 s ago or more were never taken: no Celery worker consumed "
            f"Celery queue 'mail-io' (jobs {mail.pk} (cel.record)). Start a worker on it (celery "
            "-A <your app> worker -Q mail-io) or map the queue with DEBOUNCE_CELERY_QUEUES; the "
            "jobs stay handed off until their hand-off lease lapses, then are handed off again"
        ]
    assert [r.action for r in caplog.records] == ["not_taken"]
    assert Job.objects.get(pk=mail.pk).worker_id == "handoff:sched", "the lease still holds it"
    clock(seconds=40)
    assert check() == [], "each job is named once"


def test_the_dispatcher_counts_hand_offs_in_its_last_line(settings, caplog):
    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    dispatcher = celery_executor.Dispatcher(burst=True, handle_signals=False)
    with caplog.at_level("INFO", logger="django_debounce.celery"):
        assert dispatcher.run() == 0
    assert caplog.records[-1].getMessage() == (
        f"dispatcher {dispatcher.scheduler_id} stopped after 0 hand-off(s)"
    )


def test_celery_canvas_on_a_stacked_task_is_a_clear_error_and_the_celery_task_stays_reachable():
    from django_debounce.exceptions import CeleryFeatureError, DebounceError

    with pytest.raises(CeleryFeatureError) as raised:
        stacked.s("k", 1)
    assert isinstance(raised.value, DebounceError) and isinstance(raised.value, AttributeError)
    assert str(raised.value) == (
        "task 'cel.stacked' is stacked on the Celery task 'cel.stacked': .s is not available, "
        "because the debounce window decides when it runs (Celery's canvas would publish the "
        "Celery task itself, outside the window). Use .delay()/.apply_async() to go through "
        "the window, or .celery_task.s for the plain Celery task (no window, no job)."
    )
    assert not hasattr(stacked, "chunks")
    signature = stacked.celery_task.s("k", 1)
    assert (signature.task, signature.args) == ("cel.stacked", ("k", 1))
    assert record.celery_task is None, "a task declared with @task has no Celery task"
    with pytest.raises(AttributeError, match="no attribute 's'") as plain:
        record.s("x")
    assert not isinstance(plain.value, DebounceError)
