"""Terminal transitions, one function each (issue #9, item 2; §6, §8, §11).

Every end of a job sets its status and ``finished_at``, clears the columns only
a live job may hold, and (all but a success) cancels its READY dependents in
the same transaction. Outcome writes are fenced on the run.
"""

from __future__ import annotations

import pytest

from django_debounce import lifecycle
from django_debounce.models import DeadLetter, Job, JobDependency
from tests.conftest import T
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

Status = Job.Status


def chain(first: Job) -> tuple[Job, Job]:
    """Two READY jobs after ``first``: one depends on it, the next on that one."""
    child, grandchild = JobFactory(), JobFactory()
    JobDependency.objects.create(job=child, dependency=first)
    JobDependency.objects.create(job=grandchild, dependency=child)
    return child, grandchild


def state(job: Job) -> tuple[str, object, object, object]:
    job.refresh_from_db()
    return job.status, job.finished_at, job.window_key, job.unique_lock


def running(**fields: object) -> Job:
    """A RUNNING job of worker ``w1``, first attempt, holding a unique lock of its own."""
    fields.setdefault("attempts", 1)
    return JobFactory(status=Status.RUNNING, worker_id="w1", **fields)


@pytest.mark.parametrize(
    ("end", "status"),
    [(lifecycle.expire, Status.EXPIRED), (lifecycle.cancel_ready, Status.CANCELLED)],
)
def test_expire_and_cancel_end_ready_jobs_and_their_dependents(end, status):
    window = JobFactory(window_key="w" * 64, key_hash="w" * 64, unique_lock="u" * 64)
    child, grandchild = chain(window)
    claimed = running(unique_lock="c" * 64)
    assert end([window.pk, claimed.pk], now=T) == [child.pk, grandchild.pk]
    assert state(window) == (status, T, None, None)
    assert state(child) == state(grandchild) == (Status.CANCELLED, T, None, None)
    assert state(claimed)[0] == Status.RUNNING  # a job claimed meanwhile is left alone
    assert not DeadLetter.objects.exists()  # planned outcomes (§8)


def test_a_job_no_longer_ready_keeps_its_dependents():
    claimed = running()
    child, _ = chain(claimed)
    assert lifecycle.cancel_ready([claimed.pk], now=T) == []
    assert state(child)[0] == Status.READY


def test_shed_ends_the_job_with_a_dead_letter_and_cancels_dependents():
    job = JobFactory(unique_lock="u" * 64)
    child, grandchild = chain(job)
    letter = lifecycle.shed(job, reason="shed: rate limit 1/m exceeded", metadata={}, now=T)
    assert letter is not None and (letter.kind, letter.created_at) == (DeadLetter.Kind.SHED, T)
    assert state(job) == (Status.SHED, T, None, None)
    assert state(child)[0] == state(grandchild)[0] == Status.CANCELLED
    assert lifecycle.shed(job, reason="shed: again", metadata={}, now=T) is None


def test_bury_is_fenced_on_the_run_and_cancels_dependents():
    job = running(unique_lock="u" * 64)
    child, _ = chain(job)
    late = Job.objects.get(pk=job.pk)
    late.attempts = 0  # an earlier attempt, reclaimed since
    assert (
        lifecycle.bury(
            late, worker_id="w1", reason="failed: x", error="E: e", tb="", metadata={}, now=T
        )
        is None
    )
    assert (
        lifecycle.bury(
            job, worker_id="w2", reason="failed: x", error="E: e", tb="", metadata={}, now=T
        )
        is None
    )
    assert state(child)[0] == Status.READY
    letter = lifecycle.bury(
        job,
        worker_id="w1",
        reason="failed: 1 attempt(s); E: e",
        error="E: e",
        tb="tb",
        metadata={"attempts": 1},
        now=T,
    )
    assert letter is not None and letter.kind == DeadLetter.Kind.FAILURE
    assert state(job) == (Status.FAILED, T, None, None)
    assert (job.error, job.traceback, job.lease_expires_at) == ("E: e", "tb", None)
    assert state(child)[0] == Status.CANCELLED


def test_bury_lapsed_fails_each_job_with_a_failure_dead_letter():
    jobs = [running(attempts=4, max_retries=3) for _ in range(2)]
    child, _ = chain(jobs[0])
    letters = lifecycle.bury_lapsed(jobs, error="x.LeaseExpired: gone", now=T)
    assert [letter.job_id for letter in letters] == [job.pk for job in jobs]
    assert {letter.kind for letter in DeadLetter.objects.all()} == {DeadLetter.Kind.FAILURE}
    assert letters[0].reason == "failed: lease expired after 4 attempt(s); x.LeaseExpired: gone"
    assert letters[0].metadata == {"attempts": 4, "worker_id": "w1"}
    assert all(state(job) == (Status.FAILED, T, None, None) for job in jobs)
    assert state(child)[0] == Status.CANCELLED


def test_succeed_is_fenced_and_leaves_dependents_ready():
    job = running(unique_lock="u" * 64)
    child, _ = chain(job)
    assert lifecycle.succeed(job, worker_id="w2", result=1, now=T) == 0
    assert lifecycle.succeed(job, worker_id="w1", result={"ok": True}, now=T) == 1
    assert state(job) == (Status.SUCCESSFUL, T, None, None)
    assert (job.result, job.lease_expires_at) == ({"ok": True}, None)
    assert state(child)[0] == Status.READY
    assert lifecycle.succeed(job, worker_id="w1", result=2, now=T) == 0  # already finished
