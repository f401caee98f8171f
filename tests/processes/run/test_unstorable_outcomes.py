"""Outcomes a database cannot store as they are: each run is recorded exactly once (issue #8).

A task's result or error that the database would refuse (an int JSON cannot write, a
lone surrogate, nesting past MariaDB's 31 levels, a result past the payload limit) is
stored in a safe form; a write the database refuses for good ends the job FAILED with a
dead letter naming why. Before, such a write raised out of the worker, the job stayed
RUNNING until its lease lapsed, and the task ran again. The tasks are in
``tests/testapp/tasks_storable.py``; every test runs the real worker command, on
whichever database the suite runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import override_settings

from django_debounce import enqueue
from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.procs import processes
from tests.testapp.models import CallLog

Status = Job.Status


def runs(name: str) -> int:
    return CallLog.objects.filter(task=name).count()


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.django_db
def test_a_result_json_cannot_write_is_recorded_once_as_a_short_repr(burst):
    job = enqueue("st.huge_int")
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, runs("st.huge_int")) == (Status.SUCCESSFUL, 1, 1)
    assert job.result == "<int of 16,610 bits, too long to write in decimal>"
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db
def test_an_int_at_the_digit_limit_is_stored_exactly(burst):
    # 4,300 digits: the most json writes and reads back (codec.MAX_INT_DIGITS).
    job = enqueue("st.returns", args=[10**4299])
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCESSFUL, 1)
    assert job.result == 10**4299


@pytest.mark.django_db
def test_an_error_holding_a_lone_surrogate_is_recorded_with_its_real_text(burst):
    job = enqueue("st.surrogate_error")
    burst()
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.status, job.attempts, runs("st.surrogate_error")) == (Status.FAILED, 1, 1)
    assert job.error == "ValueError: cannot open report-\ufffd.csv"
    assert letter.error == job.error
    assert letter.reason == "failed: 1 attempt(s); ValueError: cannot open report-\ufffd.csv"
    assert "report-\ufffd.csv" in letter.traceback
    assert job.traceback == letter.traceback


@pytest.mark.django_db
def test_a_long_error_is_cut_to_the_documented_length_note_included(burst):
    """``error`` and ``traceback`` hold at most 65,536 characters, the cut note counted in."""
    message = "boom \U0001f600 " + "z" * 100_000
    job = enqueue("st.fails", args=[message], max_retries=0)
    burst()
    job.refresh_from_db()
    assert (job.status, runs("st.fails")) == (Status.FAILED, 1)
    full = f"RuntimeError: {message}"
    assert 65_500 < len(job.error) <= 65_536
    kept = 65_536 - len(f"… [cut: {len(full):,} more characters]")
    assert job.error == f"{full[:kept]}… [cut: {len(full) - kept:,} more characters]"
    assert len(job.traceback) <= 65_536 and job.traceback.endswith(" more characters]")
    assert DeadLetter.objects.get(job=job).error == job.error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("levels", "stored"),
    [
        (31, nested(31)),  # the deepest JSON every database accepts: stored as itself
        (32, "[[[[[[[[[[[...]]]]]]]]]]]"),  # MariaDB refuses a 32nd level: a short repr
        (40, "[[[[[[[[[[[...]]]]]]]]]]]"),
    ],
)
def test_a_result_nested_past_the_depth_limit_is_recorded_once_as_a_short_repr(
    burst, levels, stored
):
    job = enqueue("st.nested", args=[levels])
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, runs("st.nested")) == (Status.SUCCESSFUL, 1, 1)
    assert job.result == stored


@pytest.mark.django_db
@override_settings(DEBOUNCE_MAX_PAYLOAD_BYTES=4096)
def test_a_result_past_the_size_limit_is_stored_as_a_cut_repr(burst):
    small, large = enqueue("st.text", args=[4000]), enqueue("st.text", args=[20_000])
    burst()
    small.refresh_from_db()
    large.refresh_from_db()
    assert (small.status, small.result) == (Status.SUCCESSFUL, "x" * 4000)  # 4,002 bytes
    # reprlib's cut: 10,000 characters, the middle replaced by "...".
    assert (large.status, large.attempts) == (Status.SUCCESSFUL, 1)
    assert large.result == "'" + "x" * 4997 + "..." + "x" * 4998 + "'"
    assert runs("st.text") == 2


@pytest.mark.django_db
def test_text_no_database_stores_in_a_result_becomes_the_replacement_character(burst):
    job = enqueue("st.bad_text")
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, runs("st.bad_text")) == (Status.SUCCESSFUL, 1, 1)
    assert job.result == {"name": "report-\ufffd.csv", "nul": "a\ufffdb", "key\ufffd": [1]}


# -- the database refuses the write itself ---------------------------------------------
#
# A trigger makes the real database refuse an outcome write, as it refuses data it cannot
# hold (PostgreSQL's "program limit exceeded", MariaDB's "incorrect string value"): the
# error each vendor raises for it is one a retry cannot fix.

REFUSAL = "outcome refused by test trigger"


@pytest.fixture
def refuse_updates() -> Iterator[object]:
    """Return ``install(condition)``: make UPDATEs of jobs matching ``condition`` fail.

    ``condition`` is SQL over ``NEW`` (the row as the UPDATE would leave it).
    """
    vendor = connection.vendor

    def install(condition: str) -> None:
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute(
                    "CREATE FUNCTION st_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"IF {condition} THEN RAISE EXCEPTION '{REFUSAL}' "
                    "USING ERRCODE = 'program_limit_exceeded'; END IF; RETURN NEW; END $$"
                )
                cursor.execute(
                    "CREATE TRIGGER st_refuse BEFORE UPDATE ON django_debounce_job "
                    "FOR EACH ROW EXECUTE FUNCTION st_refuse()"
                )
            elif vendor == "mysql":
                cursor.execute(
                    "CREATE TRIGGER st_refuse BEFORE UPDATE ON django_debounce_job FOR EACH ROW "
                    f"BEGIN IF {condition} THEN SIGNAL SQLSTATE '45000' "
                    f"SET MESSAGE_TEXT = '{REFUSAL}'; END IF; END"
                )
            else:
                cursor.execute(
                    "CREATE TRIGGER st_refuse BEFORE UPDATE ON django_debounce_job FOR EACH ROW "
                    f"WHEN {condition} BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
                )

    yield install
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS st_refuse ON django_debounce_job")
            cursor.execute("DROP FUNCTION IF EXISTS st_refuse()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS st_refuse")


@pytest.mark.django_db(transaction=True)
def test_a_result_the_database_refuses_ends_the_job_failed_naming_why(burst, refuse_updates):
    refuse_updates("NEW.status = 'SUCCESSFUL'")  # the result and its repr are both refused
    job = enqueue("st.returns", args=[{"rows": 3}])
    burst()
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.status, job.attempts, runs("st.returns")) == (Status.FAILED, 1, 1)
    assert letter.reason.startswith(
        "failed: 1 attempt(s); the run succeeded but its result could not be stored: "
        "django.db.utils."
    )
    assert REFUSAL in letter.reason
    assert letter.metadata == {"attempts": 1, "unstorable": "result"}
    assert job.result is None


@pytest.mark.django_db(transaction=True)
def test_an_error_the_database_refuses_ends_the_job_failed_naming_why(burst, refuse_updates):
    refuse_updates("NEW.status = 'READY' AND NEW.error <> ''")  # the retry's write is refused
    job = enqueue("st.fails", args=["boom"])  # max_retries=2: would be retried
    burst()
    job.refresh_from_db()
    letter = DeadLetter.objects.get(job=job)
    assert (job.status, job.attempts, runs("st.fails")) == (Status.FAILED, 1, 1)
    assert letter.reason.startswith(
        "failed: 1 attempt(s); the run failed and its error could not be stored: django.db.utils."
    )
    assert REFUSAL in letter.reason
    assert (letter.error, job.error) == ("RuntimeError: boom", "RuntimeError: boom")
    assert letter.metadata == {"attempts": 1, "unstorable": "error"}


# -- a real worker process, job threads and all -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_records_each_unstorable_outcome_once(tmp_path):
    huge = enqueue("st.huge_int")
    surrogate = enqueue("st.surrogate_error")
    deep = enqueue("st.nested", args=[40])
    with processes(tmp_path, child_env()) as procs:
        worker = procs.worker("--burst", "--concurrency", "2")
        assert worker.wait(120) == 0, worker.tail()
    for job in (huge, surrogate, deep):
        job.refresh_from_db()
    assert [(j.status, j.attempts) for j in (huge, surrogate, deep)] == [
        (Status.SUCCESSFUL, 1),
        (Status.FAILED, 1),
        (Status.SUCCESSFUL, 1),
    ], procs.tails()
    assert [runs("st.huge_int"), runs("st.surrogate_error"), runs("st.nested")] == [1, 1, 1]
    assert huge.result == "<int of 16,610 bits, too long to write in decimal>"
    assert surrogate.error == "ValueError: cannot open report-\ufffd.csv"
    assert deep.result == "[[[[[[[[[[[...]]]]]]]]]]]"
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == [surrogate.pk]
