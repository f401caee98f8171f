"""Inputs and failures found by an adversarial review: each is refused cleanly or survived.

Every case asserts that nothing was written (or that the run is recorded once),
on whichever database the suite runs.
"""

from __future__ import annotations

import enum
import math

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_debounce import codec, debounced_task, enqueue, task
from django_debounce.checks.settings import check_use_tz
from django_debounce.exceptions import (
    ConfigurationError,
    KeyResolutionError,
    PayloadError,
)
from django_debounce.models import DeadLetter, Job
from django_debounce.signals import job_enqueued, job_started
from tests.testapp.models import CallLog

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "value",
    [
        "nul \x00 inside",
        {"key\x00": 1},
        ["x", ["deep \x00"]],
        "lone surrogate \ud800",
    ],
)
def test_text_a_database_cannot_store_is_a_payload_error(value):
    @task
    def store(value):
        pass

    with pytest.raises(PayloadError):
        store.delay(value)
    assert Job.objects.count() == 0


def test_nul_in_a_key_is_a_key_resolution_error():
    @debounced_task(debounce="1m", debounce_max_wait="5m", debounce_key="k:{0}")
    def keyed(name):
        pass

    with pytest.raises(KeyResolutionError):
        keyed.delay("a\x00b")
    assert Job.objects.count() == 0


def test_payload_nesting_is_bounded_so_every_database_stores_it():
    nested: list = []
    for _ in range(codec.MAX_DEPTH + 5):
        nested = [nested]

    @task
    def deep(value):
        pass

    with pytest.raises(PayloadError, match="nested too deeply"):
        deep.delay(nested)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("value", [1e16, 1e308, -0.0, 2.5, 1.0, 1.5e-7])
def test_floats_round_trip_exactly_through_the_database(value, burst):
    @task(name="hardening.floats")
    def floats(value):
        CallLog.objects.create(
            task="floats", payload={"repr": repr(value), "type": type(value).__name__}
        )

    floats.delay(value)
    burst()
    log = CallLog.objects.get()
    assert log.payload == {"repr": repr(value), "type": "float"}
    if value == 0:
        assert math.copysign(1, float(log.payload["repr"])) == -1


def test_default_key_accepts_an_enum_default(clock):
    class Colour(enum.Enum):
        RED = "red"

    @debounced_task(debounce="1m", debounce_max_wait="5m")
    def paint(item: int, colour: Colour = Colour.RED):
        pass

    first = paint.delay(1)
    second = paint.delay(item=1)
    assert (first.outcome, second.outcome, second.id) == ("created", "debounced", first.id)


@pytest.mark.parametrize(
    "options",
    [
        {"metadata": {"x": float("nan")}},
        {"metadata": {1: "int key"}},
        {"notes": 0},
        {"queue": " default"},
        {"max_retries": 2**40},
    ],
)
def test_bad_options_are_configuration_errors_not_contention(options):
    @task
    def plain():
        pass

    with pytest.raises(ConfigurationError):
        plain.apply_async(**options)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "options",
    [
        {"debounce_key": 5},
        {"debounce_replace_payload": "no"},
        {"debounce_merge": 5},
    ],
)
def test_bad_debounce_options_per_call(options):
    @debounced_task(debounce="1m", debounce_max_wait="5m", debounce_key="k")
    def windowed():
        pass

    with pytest.raises(ConfigurationError):
        windowed.apply_async(**options)
    assert Job.objects.count() == 0


def test_task_names_fit_the_column():
    with pytest.raises(ConfigurationError, match="255"):

        @task(name="x" * 256)
        def too_long():
            pass


@pytest.mark.parametrize("queue", ["", "default,other", " default", "x" * 101])
def test_worker_refuses_queue_names_that_serve_nothing(queue):
    with pytest.raises(CommandError, match="--queue"):
        call_command("run_debounce_worker", burst=True, queues=[queue])


def test_use_tz_false_is_an_error():
    with override_settings(USE_TZ=False):
        assert [m.id for m in check_use_tz()] == ["django_debounce.E011"]
    assert check_use_tz() == []


def test_enqueue_refuses_use_tz_false_as_the_worker_does():
    @task(name="hardening.tz")
    def tz():
        pass

    tz.delay()  # USE_TZ = True: read once and kept
    with override_settings(USE_TZ=False):
        with pytest.raises(ConfigurationError, match=r"needs USE_TZ = True \(system check"):
            tz.delay()
        with pytest.raises(ConfigurationError, match="django_debounce.E011"):
            enqueue("hardening.tz")
    assert Job.objects.count() == 1  # nothing written with naive local times
    tz.delay()  # setting_changed forgot the kept value: True again
    assert Job.objects.count() == 2


def test_unstorable_result_is_recorded_once_not_rerun(burst):
    @task(name="hardening.nul_result", max_retries=2)
    def nul_result():
        CallLog.objects.create(task="nul_result")
        return {"text": "a\x00b", "set": "ok"}

    @task(name="hardening.set_result", max_retries=2)
    def set_result():
        CallLog.objects.create(task="set_result")
        return {1, 2}

    nul_job = nul_result.delay()
    set_job = set_result.delay()
    burst()
    nul_job.refresh_from_db()
    set_job.refresh_from_db()
    assert (nul_job.status, nul_job.attempts) == (Job.Status.SUCCESSFUL, 1)
    assert nul_job.result == {"text": "a\ufffdb", "set": "ok"}
    assert (set_job.status, set_job.result) == (Job.Status.SUCCESSFUL, "{1, 2}")
    assert CallLog.objects.count() == 2


def test_error_message_with_nul_is_recorded(burst):
    @task(name="hardening.nul_error", max_retries=0)
    def nul_error():
        raise ValueError("bad\x00byte")

    job = nul_error.delay()
    burst()
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.error == "ValueError: bad\ufffdbyte"
    assert DeadLetter.objects.get(job=job).error == "ValueError: bad\ufffdbyte"


def test_a_raising_signal_receiver_strands_nothing(burst):
    @task(name="hardening.signalled")
    def signalled():
        CallLog.objects.create(task="signalled")

    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    job_enqueued.connect(broken)
    job_started.connect(broken)
    try:
        job = signalled.delay()  # the committed enqueue is reported as a success
        burst()
    finally:
        job_enqueued.disconnect(broken)
        job_started.disconnect(broken)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCESSFUL
    assert CallLog.objects.count() == 1
