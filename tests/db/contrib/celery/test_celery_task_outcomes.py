"""What the Celery task ``django_debounce.run_job`` ends in, per job outcome (decision 138).

The task body runs in this process (a Celery task object called directly runs
its function); the real worker's AsyncResult state is checked in
tests/processes/contrib/celery/test_celery_executor.py.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from celery.exceptions import Ignore, Retry

from django_debounce.contrib.celery import handoff
from django_debounce.contrib.celery.tasks import run_handoff_message
from django_debounce.exceptions import DebounceError, JobFailedError, JobRetryError
from django_debounce.models import DeadLetter, Job
from tests.testapp.tasks_celery import fails, record

pytestmark = pytest.mark.django_db

Status = Job.Status


def _handoff() -> None:
    handoff.claim_for_handoff(scheduler_id="s", limit=10, lease=dt.timedelta(seconds=30))


def test_a_retry_ends_the_task_normally_and_the_last_attempt_raises_after_the_dead_letter(clock):
    job = fails.delay("x")
    for attempt in (1, 2):
        _handoff()
        # RETRY, never SUCCESS: a result backend keeps a SUCCESS for good (decision 152).
        with pytest.raises(Retry) as retry:
            run_handoff_message(job.pk)
        row = Job.objects.get(pk=job.pk)
        assert (row.status, row.attempts) == (Status.READY, attempt), "a retry is scheduled"
        assert isinstance(retry.value.exc, JobRetryError) and retry.value.when == row.run_at
        assert (
            str(retry.value)
            == str(retry.value.exc)
            == (
                f"job {job.pk} (cel.fails) is READY again and runs at "
                f"{row.run_at:%Y-%m-%d %H:%M:%S} UTC under this task id: RuntimeError: no luck for x"
            )
        )
        clock(at=row.run_at)
    _handoff()
    with pytest.raises(JobFailedError) as raised:
        run_handoff_message(str(job.pk))
    assert isinstance(raised.value, DebounceError)
    assert str(raised.value) == (
        f"job {job.pk} (cel.fails) failed for good on attempt 3: RuntimeError: no luck for x; "
        "its dead letter is written (`manage.py retry_dead_letters` runs it again)"
    )
    # The outcome was written before the raise: FAILED with its dead letter.
    assert Job.objects.get(pk=job.pk).status == Status.FAILED
    assert DeadLetter.objects.get(job=job.pk).error == "RuntimeError: no luck for x"
    with pytest.raises(Ignore):  # a redelivered message is a no-op: it writes no Celery state
        run_handoff_message(job.pk)


def test_an_unknown_task_is_retried_during_its_grace_then_fails_the_celery_task(clock):
    old = record.delay("old")
    clock(minutes=11)  # past DEBOUNCE_UNKNOWN_TASK_GRACE (10 min) since its enqueue
    young = record.delay("young")
    _handoff()
    # Renamed after the hand-off: the Celery worker does not know the name (decision 154).
    Job.objects.filter(pk__in=[old.pk, young.pk]).update(task_name="cel.renamed_away")
    with pytest.raises(Retry) as retry:  # an old Celery worker during a deploy
        run_handoff_message(young.pk)
    assert "UnknownTaskError: no task named 'cel.renamed_away'" in str(retry.value)
    assert Job.objects.get(pk=young.pk).attempts == 0, "put back, no attempt spent"
    with pytest.raises(JobFailedError, match=rf"job {old.pk} \(cel.renamed_away\) failed for good"):
        run_handoff_message(old.pk)
    assert DeadLetter.objects.get(job=old.pk).reason == "unknown_task: cel.renamed_away"


def test_a_success_returns_the_stored_result(clock):
    job = record.delay("s")
    _handoff()
    assert run_handoff_message(job.pk)["tag"] == "s"
    assert Job.objects.get(pk=job.pk).status == Status.SUCCESSFUL


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (["abc"], {}),
        ([None], {}),
        ([], {}),
        ([1, 2], {}),
        ([True], {}),
        ([], {"jid": 1}),
        # Unicode digits pass str.isdigit(); int() refuses '²' and reads '١' (Arabic-Indic) as 1.
        (["²"], {}),
        (["١"], {}),
        ([], {"job_id": "٣"}),
        # Out of the BigAutoField range: 5,000 digits (past int()'s 4,300-digit limit), 2**63, 0, -1.
        (["9" * 5000], {}),
        ([10**5000], {}),
        ([2**63], {}),
        ([str(2**63)], {}),
        ([0], {}),
        ([-1], {}),
    ],
)
def test_a_hand_crafted_message_with_bad_arguments_is_one_error_line(clock, caplog, args, kwargs):
    job = record.delay("b")
    _handoff()
    with caplog.at_level(logging.INFO, logger="django_debounce"), pytest.raises(Ignore):
        run_handoff_message(*args, **kwargs)
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR and line.exc_info is None
    assert line.getMessage().startswith("ignored a django_debounce.run_job message with args=")
    assert "it takes one job id (an integer, 1 to 2**63 - 1, or its ASCII decimal digits)" in (
        line.getMessage()
    )
    assert len(line.getMessage()) < 600, "a long argument is cut, not logged whole"
    assert Job.objects.get(pk=job.pk).status == Status.RUNNING, "no job was touched"


def test_the_job_id_by_keyword_is_accepted(clock):
    job = record.delay("k")
    _handoff()
    assert run_handoff_message(job_id=job.pk)["tag"] == "k"
