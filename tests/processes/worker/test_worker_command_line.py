"""``run_debounce_worker``: flags, validation, the command line (§10, §11)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from django_debounce.models import DeadLetter, Job
from tests.conftest import child_env
from tests.factories import JobFactory
from tests.testapp.models import CallLog
from tests.testapp.tasks_broken_receiver import MESSAGE as BROKEN_RECEIVER


def run_cli(
    *argv: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m django run_debounce_worker …`` against this test's database."""
    return subprocess.run(
        [sys.executable, "-m", "django", "run_debounce_worker", *argv],
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tags() -> list[str]:
    return list(CallLog.objects.filter(task="wrk.tag").order_by("id").values_list("key", flat=True))


@pytest.mark.django_db(transaction=True)
def test_command_line_burst_runs_due_jobs_and_exits_0(clock):
    from tests.conftest import T

    for name in ("one", "two", "three"):
        JobFactory(task_name="wrk.tag", args=[name])
    later = JobFactory(task_name="wrk.tag", args=["later"], run_at=T.replace(year=2099))

    proc = run_cli("--burst")

    assert proc.returncode == 0, proc.stderr
    assert sorted(tags()) == ["one", "three", "two"]
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == 3
    later.refresh_from_db()
    assert later.status == Job.Status.READY


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verbosity", ["0", "1"])
def test_console_log_level_follows_verbosity_and_never_hides_a_failure(verbosity):
    """With no LOGGING for the package, -v 0 keeps warnings and errors and -v 1 adds INFO."""
    failing = JobFactory(task_name="wrk.value_error", max_retries=0)
    JobFactory(task_name="wrk.tag", args=["fine"])

    proc = run_cli("--burst", "-v", verbosity, env=child_env(DEBOUNCE_TEST_NO_LOGGING="1"))

    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    levels = {line.split()[2] for line in lines if line[:2] == "20" and len(line.split()) > 2}
    quiet = {"WARNING", "ERROR"}  # the run that raised, and its dead letter
    expected = {"0": quiet, "1": quiet | {"INFO"}}
    assert levels == expected[verbosity], proc.stderr
    letter = DeadLetter.objects.get(job_id=failing.pk)
    assert any(f"dead letter {letter.pk}: failed" in line for line in lines)
    assert "ValueError: boom" in proc.stderr


@pytest.mark.django_db(transaction=True)
def test_a_raising_signal_receiver_is_logged_once_on_the_worker_stderr():
    """Django's ``send_robust`` logs the receiver's error on ``django.dispatch``; the command
    shows that logger on stderr beside its own, and the job still runs (§9)."""
    JobFactory(task_name="wrk.tag", args=["fine"])

    proc = run_cli(
        "--burst",
        env=child_env(DEBOUNCE_TEST_NO_LOGGING="1", DEBOUNCE_TEST_BROKEN_RECEIVER="1"),
    )

    assert proc.returncode == 0, proc.stderr
    assert tags() == ["fine"]
    errors = [line for line in proc.stderr.splitlines() if " ERROR django.dispatch: " in line]
    assert len(errors) == 1, proc.stderr
    assert BROKEN_RECEIVER in errors[0]
    assert proc.stderr.count(f"RuntimeError: {BROKEN_RECEIVER}") == 1, proc.stderr


@pytest.mark.django_db(transaction=True)
def test_command_line_burst_with_nothing_due_exits_0():
    proc = run_cli("--burst", "--concurrency", "2", "--queue", "a", "--queue", "b")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--concurrency", "0", "must be at least 1"),
        ("--concurrency", "-1", "must be at least 1"),
        ("--concurrency", "x", "is not an integer"),
        ("--max-jobs", "0", "must be at least 1"),
        ("--poll-interval", "0", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "-1", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "x", "is not a number of seconds"),
    ],
)
def test_command_line_rejects_bad_values_with_a_usage_error(flag, value, message):
    JobFactory(task_name="wrk.tag", args=["untouched"])
    proc = run_cli("--burst", flag, value)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert flag in proc.stderr
    assert message in proc.stderr
    assert tags() == []
    assert Job.objects.get().status == Job.Status.READY


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--concurrency", "0", "must be at least 1"),
        ("--concurrency", "-1", "must be at least 1"),
        ("--concurrency", "x", "is not an integer"),
        ("--max-jobs", "-3", "must be at least 1"),
        ("--poll-interval", "0", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "nan", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "inf", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "86401", "seconds greater than 0 and at most 86400"),
        ("--poll-interval", "soon", "is not a number of seconds"),
    ],
)
def test_call_command_argv_validation_raises_command_error(flag, value, message):
    JobFactory(task_name="wrk.tag", args=["untouched"])
    with pytest.raises(CommandError, match=message):
        call_command("run_debounce_worker", "--burst", f"{flag}={value}")
    assert tags() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("concurrency", 0),
        ("concurrency", -1),
        ("concurrency", "x"),
        ("max_jobs", 0),
        ("poll_interval", 0),
        ("poll_interval", -1.5),
        ("poll_interval", "x"),
    ],
)
def test_call_command_keyword_validation_raises_command_error(option, value):
    """Decision: keyword options get the same validation as flags, as a CommandError."""
    JobFactory(task_name="wrk.tag", args=["untouched"])
    with pytest.raises(CommandError):
        call_command("run_debounce_worker", burst=True, **{option: value})
    assert tags() == []
    assert Job.objects.get().status == Job.Status.READY


@pytest.mark.django_db
def test_call_command_accepts_numeric_strings_like_the_flags(clock):
    JobFactory(task_name="wrk.tag", args=["ran"])
    call_command("run_debounce_worker", burst=True, concurrency="1", poll_interval="0.5")
    assert tags() == ["ran"]
