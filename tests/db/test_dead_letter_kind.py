"""A dead letter's kind is a stored column (issue #9, item 4; §6, §7, §8).

Every way the package writes a dead letter sets ``kind`` from the reason's
reserved prefix (the prefixes themselves are unchanged); migration 0005 fills
it for rows written before; the admin's kind filter and the sweep read it.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from django_debounce import lifecycle
from django_debounce.models import DeadLetter, Job
from django_debounce.ops.sweep import retry_dead_letters
from django_debounce.run.leases import reclaim_expired_leases
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory

Kind = DeadLetter.Kind
BEFORE = [("django_debounce", "0004_job_window_lock_checks")]
AFTER = [("django_debounce", "0005_deadletter_kind")]

#: Reasons as the package writes them (worker, flow control, CoDel), and one it never writes.
REASONS = {
    "failed: 4 attempt(s); builtins.ValueError: boom": Kind.FAILURE,
    "failed: lease expired after 4 attempt(s); django_debounce.worker.loop.LeaseExpired: "
    "the worker running this job stopped renewing its lease": Kind.FAILURE,
    "failed: 1 attempt(s); the run succeeded but its result could not be stored: "
    "django.db.utils.DataError: invalid input": Kind.FAILURE,
    "shed: rate limit 10/m exceeded": Kind.SHED,
    "codel: waited 7.0s, over target 5s for a full interval (0.1s)": Kind.CODEL,
    "unknown_task: gone.task": Kind.UNKNOWN_TASK,
    "written by an operator's script": Kind.OTHER,
    "Shed: not a reserved prefix (case matters)": Kind.OTHER,
}


@pytest.mark.django_db(transaction=True)
def test_migration_0005_fills_the_kind_of_old_rows_from_their_reason():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old_apps = executor.loader.project_state(BEFORE).apps
        OldJob = old_apps.get_model("django_debounce", "Job")
        OldDeadLetter = old_apps.get_model("django_debounce", "DeadLetter")
        now = "2026-03-01T12:00:00Z"
        job = OldJob.objects.create(
            task_name="tests.noop",
            status="FAILED",
            run_at=now,
            last_enqueued_at=now,
            created_at=now,
        )
        ids = {
            OldDeadLetter.objects.create(
                job=job, task_name="tests.noop", reason=reason, created_at=now
            ).pk: reason
            for reason in REASONS
        }
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        stored = dict(DeadLetter.objects.values_list("pk", "kind"))
        assert {ids[pk]: kind for pk, kind in stored.items()} == REASONS
        assert dict(DeadLetter.objects.values_list("pk", "reason")) == ids  # reasons unchanged
        # Reversible: back to 0004 (the column goes, the rows stay) and forward again.
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert OldDeadLetter.objects.count() == len(REASONS)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        assert dict(DeadLetter.objects.values_list("pk", "kind")) == stored
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("django_debounce"))


@pytest.mark.django_db
@pytest.mark.parametrize(("reason", "kind"), list(REASONS.items()))
def test_the_builder_sets_the_kind_of_each_reason(reason, kind):
    job = JobFactory(status=Job.Status.FAILED)
    letter = lifecycle.new_dead_letter(job, reason=reason, metadata={}, now=T)
    assert letter.kind == kind
    letter.save()
    assert DeadLetter.objects.get(pk=letter.pk).kind == kind


@pytest.mark.django_db
@pytest.mark.parametrize(("reason", "kind"), list(REASONS.items()))
def test_a_row_written_without_the_builder_gets_its_kind_too(reason, kind):
    """``save()`` and ``bulk_create`` derive a missing kind, so no row is stored without one."""
    created = DeadLetterFactory(reason=reason)
    job = JobFactory(status=Job.Status.FAILED)
    (bulk,) = DeadLetter.objects.bulk_create(
        [DeadLetter(job=job, task_name=job.task_name, reason=reason, created_at=T)]
    )
    assert DeadLetter.objects.get(pk=created.pk).kind == kind
    assert DeadLetter.objects.get(pk=bulk.pk).kind == kind


@pytest.mark.django_db
def test_each_terminal_transition_writes_the_kind_of_its_reason(clock):
    codel_job, shed_job, failed, unknown = (JobFactory() for _ in range(4))
    lifecycle.shed(
        codel_job, reason="codel: waited 7.0s", metadata={"codel": True}, now=clock(seconds=1)
    )
    lifecycle.shed(shed_job, reason="shed: rate limit 1/m exceeded", metadata={}, now=T)
    for job, reason in ((failed, "failed: 1 attempt(s); x.E: e"), (unknown, "unknown_task: x")):
        Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, worker_id="w", attempts=1)
        job.refresh_from_db()
        lifecycle.bury(job, worker_id="w", reason=reason, error="x.E: e", tb="", metadata={}, now=T)
    lapsed = JobFactory(
        status=Job.Status.RUNNING,
        worker_id="gone",
        attempts=2,
        max_retries=1,
        lease_expires_at=T - dt.timedelta(seconds=1),
    )
    assert reclaim_expired_leases() == (0, 1)
    kinds = dict(DeadLetter.objects.values_list("job_id", "kind"))
    assert kinds == {
        codel_job.pk: Kind.CODEL,
        shed_job.pk: Kind.SHED,
        failed.pk: Kind.FAILURE,
        unknown.pk: Kind.UNKNOWN_TASK,
        lapsed.pk: Kind.FAILURE,
    }


@pytest.mark.django_db
def test_shed_refuses_a_reason_that_is_not_a_shed():
    job = JobFactory()
    with pytest.raises(ValueError, match="shed reason"):
        lifecycle.shed(job, reason="failed: 1 attempt(s)", metadata={}, now=T)
    assert Job.objects.get(pk=job.pk).status == Job.Status.READY
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db
def test_admin_kind_filter_returns_the_rows_of_that_kind(admin_client):
    letters = {
        kind: [
            DeadLetterFactory(reason=reason, created_at=T + dt.timedelta(seconds=n))
            for n, (reason, of) in enumerate(REASONS.items())
            if of == kind
        ]
        for kind in Kind
    }
    url = reverse("admin:django_debounce_deadletter_changelist")
    for kind in (Kind.FAILURE, Kind.SHED, Kind.CODEL, Kind.UNKNOWN_TASK):
        response = admin_client.get(url, {"kind": kind.value})
        listed = [letter.pk for letter in response.context["cl"].result_list]
        assert listed == [letter.pk for letter in reversed(letters[kind])], kind
    everything = admin_client.get(url).context["cl"].result_list
    assert {letter.pk for letter in everything} >= {letter.pk for letter in letters[Kind.OTHER]}


@pytest.mark.django_db
def test_the_sweep_skips_reserved_kinds_and_retries_the_others(clock):
    letters = {reason: DeadLetterFactory(reason=reason) for reason in REASONS}
    result = retry_dead_letters()
    reserved = [
        r for r, kind in REASONS.items() if kind in (Kind.SHED, Kind.CODEL, Kind.UNKNOWN_TASK)
    ]
    assert result.reserved == len(reserved)
    retried = {
        r for r, letter in letters.items() if DeadLetter.objects.get(pk=letter.pk).retried_at
    }
    assert retried == set(REASONS) - set(reserved)
