"""Bad input is refused before anything is written, with the package's own errors (issue #8).

The same limits hold on every database (decision 29 in docs/decisions.md): text
with NUL or a lone surrogate, an int of more than 4,300 digits, JSON nested past the 31
levels MariaDB accepts, a payload past ``DEBOUNCE_MAX_PAYLOAD_BYTES``, a task name that
does not fit ``Job.task_name``. Before, each of these reached the database and came
back as a raw ``DataError``/``IntegrityError``/``OperationalError`` (or a bare
``ValueError``) on some database, and was silently accepted on others.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import override_settings

from django_debounce import enqueue, task
from django_debounce.exceptions import ConfigurationError, PayloadError
from django_debounce.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status


@task(name="limits.anything")
def anything(*args: Any, **kwargs: Any) -> None:
    """Accept any call."""


def nested(levels: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``levels`` lists: ``nested(2)`` is ``[[1]]``."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def refused(error: type[Exception], match: str, call: Any) -> str:
    """Run ``call``, expecting ``error`` matching ``match``; check nothing was written."""
    with pytest.raises(error, match=match) as raised:
        call()
    assert Job.objects.count() == 0
    return str(raised.value)


# -- text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"note": "a\x00b"}, r"metadata\['note'\] contains a NUL character"),
        ({"tags": ["ok", {"deep": "\x00"}]}, r"metadata\['tags'\]\[1\]\['deep'\] contains a NUL"),
        ({"k\x00": 1}, r"metadata key 'k\\x00' contains a NUL"),
        ({"name": "report-\udcff"}, r"metadata\['name'\] holds a lone surrogate"),
    ],
)
def test_text_no_database_stores_in_metadata_is_a_configuration_error(metadata, where):
    refused(ConfigurationError, where, lambda: anything.apply_async(metadata=metadata))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: anything.delay(**{"a\x00": 1}), id="registered"),
        pytest.param(lambda: enqueue("limits.unknown", kwargs={"a\x00": 1}), id="by-name"),
    ],
)
def test_nul_in_a_keyword_argument_name_is_a_payload_error(call):
    refused(PayloadError, r"kwargs key 'a\\x00' contains a NUL character", call)


def test_a_keyword_argument_name_that_is_not_a_str_is_a_payload_error():
    call = lambda: enqueue("limits.unknown", kwargs={1: "x"})  # noqa: E731
    refused(
        PayloadError, "kwargs has the key 1 of type int; keyword argument names must be str", call
    )


@pytest.mark.parametrize(
    "options",
    [{"notes": "a\udcffb"}, {"queue": "q\udcff"}],
    ids=["notes", "queue"],
)
def test_a_lone_surrogate_in_notes_or_queue_is_a_configuration_error(options):
    refused(ConfigurationError, "lone surrogates", lambda: anything.apply_async(**options))


# -- ints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "path"),
    [
        ([10**5000], {}, r"args\[0\]"),
        ([-(10**4300)], {}, r"args\[0\]"),  # 4,301 digits
        ([], {"n": {"ids": [1, 10**4300]}}, r"kwargs\['n'\]\['ids'\]\[1\]"),
    ],
)
def test_an_int_json_cannot_carry_is_a_payload_error(args, kwargs, path):
    message = refused(
        PayloadError,
        path + " is an int of more than 4300 digits",
        lambda: anything.apply_async(args=args, kwargs=kwargs),
    )
    assert "hex(value)" in message


def test_an_int_of_4300_digits_is_stored():
    job = anything.delay(10**4299, -(10**4299) + 1)
    job.refresh_from_db()
    assert job.args == [10**4299, -(10**4299) + 1]


def test_an_int_json_cannot_carry_in_metadata_is_a_configuration_error():
    refused(
        ConfigurationError,
        r"metadata\['n'\] is an int of more than 4300 digits",
        lambda: anything.apply_async(metadata={"n": 10**4300}),
    )


# -- task names (enqueue by name) ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("x" * 256, r"'x{60}'… \(256 characters\)"),
        ("tasks.a\x00b", r"'tasks.a\\x00b'"),
        ("tasks.\udcff", r"'tasks.\\udcff'"),
    ],
    ids=["256-characters", "nul", "lone-surrogate"],
)
def test_enqueue_by_name_refuses_a_name_that_does_not_fit_the_column(name, shown):
    refused(
        ConfigurationError,
        f"task name {shown} must be a non-empty str of at most 255 characters",
        lambda: enqueue(name),
    )


def test_enqueue_by_name_takes_a_name_of_255_characters():
    job = enqueue("x" * 255)
    job.refresh_from_db()
    assert job.task_name == "x" * 255


# -- depth: one limit on every database -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([nested(30)], {}),  # 30 lists inside the args list: 31 levels in the column
        ([], {"v": nested(30)}),
        ([nested(28, uuid.UUID(int=1))], {}),  # a tagged value is an object and an array
        ([nested(27, {"__debounce__": 1})], {}),  # an escaped dict is stored 3 levels deep
    ],
    ids=["list", "kwarg", "tagged", "escaped-dict"],
)
def test_the_deepest_payload_every_database_accepts_is_stored_and_runs(burst, args, kwargs):
    @task(name="limits.deep")
    def deep(*args: Any, **kwargs: Any) -> None:
        assert (list(args), kwargs) == (expected_args, kwargs_expected)

    expected_args, kwargs_expected = args, kwargs
    job = deep.apply_async(args=args, kwargs=kwargs)
    burst()
    job.refresh_from_db()
    assert (job.status, job.error) == (Status.SUCCESSFUL, "")


@pytest.mark.parametrize(
    ("args", "kwargs", "path"),
    [
        ([nested(31)], {}, r"args\[0\]" + r"\[0\]" * 30),
        ([], {"v": nested(31)}, r"kwargs\['v'\]" + r"\[0\]" * 30),
        ([nested(29, uuid.UUID(int=1))], {}, r"args\[0\]" + r"\[0\]" * 29),
        ([nested(28, {"__debounce__": 1})], {}, r"args\[0\]" + r"\[0\]" * 28),
        ([nested(40)], {}, r"args\[0\]" + r"\[0\]" * 30),
    ],
    ids=["list", "kwarg", "tagged", "escaped-dict", "40-levels"],
)
def test_a_payload_nested_deeper_than_every_database_accepts_is_a_payload_error(args, kwargs, path):
    message = refused(
        PayloadError,
        path + " is nested too deeply",
        lambda: anything.apply_async(args=args, kwargs=kwargs),
    )
    assert "at most 30 levels of lists and dicts" in message


def test_metadata_nested_deeper_than_every_database_accepts_is_a_configuration_error():
    anything.apply_async(metadata={"v": nested(30)})  # the metadata dict is level 1
    Job.objects.all().delete()
    refused(
        ConfigurationError,
        "is nested too deeply",
        lambda: anything.apply_async(metadata={"v": nested(31)}),
    )


# -- size: DEBOUNCE_MAX_PAYLOAD_BYTES ---------------------------------------------------


@override_settings(DEBOUNCE_MAX_PAYLOAD_BYTES=4096)
@pytest.mark.parametrize(
    ("text", "size"),
    [("x" * 4090, 4096), ("é" * 681, 4092)],  # json.dumps writes é as \u00e9: 6 bytes
    ids=["ascii", "escaped"],
)
def test_a_payload_up_to_the_limit_is_stored(text, size):
    assert len(json.dumps([text])) + len(json.dumps({})) == size
    job = anything.delay(text)
    job.refresh_from_db()
    assert job.args == [text]


@override_settings(DEBOUNCE_MAX_PAYLOAD_BYTES=4096)
def test_many_small_items_are_measured_exactly():
    # The walk's bound for 800 ints (26 bytes each) passes 4,096; the JSON itself does not.
    args = [list(range(800))]
    assert len(json.dumps(args)) + len(json.dumps({})) == 3894
    job = anything.apply_async(args=args)
    job.refresh_from_db()
    assert job.args == args


@override_settings(DEBOUNCE_MAX_PAYLOAD_BYTES=4096)
@pytest.mark.parametrize(
    ("args", "kwargs", "size"),
    [
        (["x" * 4091], {}, "4,097"),
        (["é" * 682], {}, "4,098"),
        ([list(range(1000))], {"more": "y" * 100}, "5,004"),  # many small items
    ],
    ids=["ascii", "escaped", "items"],
)
def test_a_payload_past_the_limit_is_a_payload_error_naming_the_setting(args, kwargs, size):
    assert len(json.dumps(args)) + len(json.dumps(kwargs)) == int(size.replace(",", ""))
    refused(
        PayloadError,
        rf"the payload \(args and kwargs\) is {size} bytes of JSON; the limit is 4,096 "
        r"\(DEBOUNCE_MAX_PAYLOAD_BYTES\)",
        lambda: anything.apply_async(args=args, kwargs=kwargs),
    )


def test_a_20_mb_payload_is_a_payload_error_on_every_database():
    # MariaDB refused this with "server has gone away" (max_allowed_packet, 16 MiB).
    refused(PayloadError, "the limit is 1,048,576", lambda: anything.delay("x" * 20_000_000))


def test_a_payload_of_the_default_limit_is_stored_and_runs(burst):
    text = "x" * (1024 * 1024 - 6)  # ["…"] and {}: exactly 1 MiB of JSON

    @task(name="limits.big")
    def big(value: str) -> int:
        return len(value)

    job = big.delay(text)
    burst()
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.SUCCESSFUL, len(text))


@override_settings(DEBOUNCE_MAX_PAYLOAD_BYTES=2048)
def test_metadata_and_notes_past_the_limit_are_configuration_errors():
    refused(
        ConfigurationError,
        r"metadata is 2,060 bytes of JSON; the limit is 2,048 \(DEBOUNCE_MAX_PAYLOAD_BYTES\)",
        lambda: anything.apply_async(metadata={"note": "x" * 2048}),
    )
    refused(
        ConfigurationError,
        r"notes are 2,050 bytes of UTF-8; the limit is 2,048",
        lambda: anything.apply_async(notes="é" * 1025),
    )
    anything.apply_async(notes="é" * 1024)  # 2,048 bytes: accepted
    assert Job.objects.get().notes == "é" * 1024
