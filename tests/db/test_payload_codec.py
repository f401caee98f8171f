"""The payload codec (contract §5, §11): exact round trips, and PayloadError with nothing written."""

from __future__ import annotations

import json
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from django_debounce import debounced_task, task
from django_debounce.codec import TAG, decode, decode_call, encode
from django_debounce.exceptions import PayloadError
from django_debounce.models import Job
from tests.conftest import T
from tests.testapp.models import Order

BERLIN = ZoneInfo("Europe/Berlin")

#: What the tasks below received, in order (they run inline under ``--burst``).
RECEIVED: list[tuple[tuple, dict]] = []


@pytest.fixture(autouse=True)
def _clear_received():
    RECEIVED.clear()
    yield
    RECEIVED.clear()


@task(name="enq.codec.capture")
def capture(*args, **kwargs):
    RECEIVED.append((args, kwargs))


@debounced_task(
    name="enq.codec.capture_debounced",
    debounce="10s",
    debounce_max_wait="1m",
    debounce_key="cap:{0}",
)
def capture_debounced(key, *args, **kwargs):
    RECEIVED.append(((key, *args), kwargs))


@debounced_task(name="enq.codec.default_key", debounce="10s", debounce_max_wait="1m")
def default_key_task(*args, **kwargs):
    RECEIVED.append((args, kwargs))


@dataclass(frozen=True)
class Point:
    x: int
    y: int


def _through_json(value):
    """Encode, store as JSON text, load and decode: what a row does to a value."""
    return decode(json.loads(json.dumps(encode(value))))


ROUND_TRIPS = [
    pytest.param(uuid.UUID("12345678-1234-5678-1234-567812345678"), id="uuid"),
    pytest.param(Decimal("1234567890.123456789"), id="decimal-precision"),
    pytest.param(Decimal("0.10"), id="decimal-trailing-zero"),
    pytest.param(Decimal("-0"), id="decimal-negative-zero"),
    pytest.param(Decimal("1E+3"), id="decimal-exponent"),
    pytest.param(date(2024, 2, 29), id="date"),
    pytest.param(time(23, 59, 59, 999999), id="time-microseconds"),
    pytest.param(time(0, 0), id="time-midnight"),
    pytest.param(time(10, 30, tzinfo=timezone(timedelta(hours=2))), id="time-with-offset"),
    pytest.param(timedelta(days=1, microseconds=1), id="timedelta"),
    pytest.param(timedelta(seconds=-1), id="timedelta-negative"),
    pytest.param(datetime(2024, 1, 15, 9, 30, 0, 123456, tzinfo=UTC), id="utc"),
    pytest.param({"a": [1, 2.5, None, True, "x"], "b": {"c": {"d": []}}}, id="nested-json"),
    pytest.param([[1, [2, [3]]], {}], id="nested-lists"),
    pytest.param(2**70, id="big-int"),
    pytest.param("ünïcødé \t \n", id="unicode-str"),
    pytest.param({TAG: ["uuid", "not-a-uuid"]}, id="user-dict-with-tag-key"),
    pytest.param({TAG: 1, "other": 2}, id="user-dict-tag-and-other-keys"),
    pytest.param({TAG: ["dict", {TAG: ["date", "x"]}]}, id="user-dict-tag-nested"),
    pytest.param({"inner": {TAG: [Decimal("1.50")]}}, id="user-dict-tag-holding-decimal"),
]


@pytest.mark.parametrize("value", ROUND_TRIPS)
def test_exact_round_trip(value):
    back = _through_json(value)
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, Decimal):
        assert str(back) == str(value)


def test_round_trip_keeps_nested_types():
    value = {"price": Decimal("0.10"), "ids": [uuid.UUID(int=7)], "when": [date(2020, 1, 1)]}
    back = _through_json(value)
    assert str(back["price"]) == "0.10"
    assert type(back["ids"][0]) is uuid.UUID and back["ids"][0] == uuid.UUID(int=7)
    assert back["when"] == [date(2020, 1, 1)]


def test_tuples_come_back_as_lists():
    assert _through_json((1, "a", (2, (3,)))) == [1, "a", [2, [3]]]


@pytest.mark.parametrize(
    ("local", "offset"),
    [
        (datetime(2024, 1, 15, 9, 30, 0, 1, tzinfo=BERLIN), timedelta(hours=1)),  # CET
        (datetime(2024, 7, 15, 9, 30, 0, 1, tzinfo=BERLIN), timedelta(hours=2)),  # CEST
    ],
)
def test_aware_datetime_keeps_instant_and_offset(local, offset):
    back = _through_json(local)
    assert back == local  # same instant
    assert back.utcoffset() == offset
    assert (back.year, back.month, back.day, back.hour, back.minute, back.microsecond) == (
        local.year,
        local.month,
        local.day,
        9,
        30,
        1,
    )
    # Project decision (documented in codec.py): the zone object is not kept,
    # the value comes back with a fixed-offset tzinfo.
    assert back.tzinfo == timezone(offset)


def test_plain_json_is_stored_as_itself():
    args = [1, 2.5, "s", None, True, [1, [2]], {"k": {"v": 1}}]
    assert json.loads(json.dumps([encode(a) for a in args])) == args


@pytest.mark.django_db
def test_values_reach_the_task_exactly(clock, burst):
    when = datetime(2024, 3, 31, 1, 59, 59, 999999, tzinfo=BERLIN)
    ref = uuid.uuid4()
    user_dict = {TAG: ["uuid", str(ref)], "n": 1}
    job = capture.delay(
        Decimal("1234567890.123456789"),
        (1, "a"),
        amount=Decimal("0.10"),
        when=when,
        ref=ref,
        day=date(2024, 2, 29),
        at=time(23, 59, 59, 999999),
        span=timedelta(days=1, microseconds=1),
        user=user_dict,
        tagged={TAG: 5},
        nested={"a": [{"b": (ref, Decimal("2.50"))}]},
    )
    # §11: plain JSON values are stored as themselves; others by the codec.
    stored = Job.objects.get(pk=job.pk)
    assert stored.args[1] == [1, "a"]
    assert decode_call(stored.args, stored.kwargs)[1]["user"] == user_dict

    burst()
    assert Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL
    [(args, kwargs)] = RECEIVED
    assert type(args[0]) is Decimal and str(args[0]) == "1234567890.123456789"
    assert args[1] == [1, "a"]
    assert type(kwargs["amount"]) is Decimal and str(kwargs["amount"]) == "0.10"
    assert kwargs["when"] == when
    assert kwargs["when"].utcoffset() == timedelta(hours=1)
    assert type(kwargs["ref"]) is uuid.UUID and kwargs["ref"] == ref
    assert kwargs["day"] == date(2024, 2, 29) and type(kwargs["day"]) is date
    assert kwargs["at"] == time(23, 59, 59, 999999)
    assert kwargs["span"] == timedelta(days=1, microseconds=1)
    assert kwargs["user"] == user_dict
    assert kwargs["tagged"] == {TAG: 5}
    assert kwargs["nested"] == {"a": [{"b": [ref, Decimal("2.50")]}]}
    assert str(kwargs["nested"]["a"][0]["b"][1]) == "2.50"


@pytest.mark.django_db
def test_debounced_payload_round_trips_through_slide_and_run(clock, burst):
    first = capture_debounced.delay("k", Decimal("0.10"), when=T)
    clock(seconds=5)
    second = capture_debounced.delay("k", Decimal("9.99"), when=T + timedelta(seconds=5))
    assert second.pk == first.pk and second.outcome == "debounced"
    clock(seconds=15)
    burst()
    assert RECEIVED == [(("k", Decimal("0.10")), {"when": T})]
    assert str(RECEIVED[0][0][1]) == "0.10"


class _Opaque:
    pass


@pytest.fixture
def open_file():
    with tempfile.TemporaryFile() as handle:
        yield handle


BAD_VALUES = {
    "naive-datetime": lambda request: datetime(2024, 1, 1, 12, 0),
    "set": lambda request: {1, 2},
    "frozenset": lambda request: frozenset({1}),
    "frozen-dataclass": lambda request: Point(1, 2),
    "open-file": lambda request: request.getfixturevalue("open_file"),
    "lambda": lambda request: lambda: None,
    "model-instance": lambda request: Order.objects.create(name="o1"),
    "nan": lambda request: float("nan"),
    "infinity": lambda request: float("-inf"),
    "dict-non-str-key": lambda request: {1: "a"},
    "bytes": lambda request: b"raw",
    "object": lambda request: _Opaque(),
}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", list(BAD_VALUES))
@pytest.mark.parametrize("how", ["arg", "kwarg", "nested", "debounced", "default-key"])
def test_payload_error_writes_nothing(request, django_assert_num_queries, kind, how):
    value = BAD_VALUES[kind](request)
    before = Job.objects.count()
    with django_assert_num_queries(0), pytest.raises(PayloadError) as info:
        if how == "arg":
            capture.delay(1, value)
        elif how == "kwarg":
            capture.delay(thing=value)
        elif how == "nested":
            capture.delay(meta={"ids": [1, {"deep": value}]})
        elif how == "debounced":  # the key resolves; the payload does not encode
            capture_debounced.delay("k", value)
        else:  # no debounce_key: the default key hashes the arguments
            default_key_task.delay(value)
    assert isinstance(info.value, TypeError)
    assert Job.objects.count() == before
    message = str(info.value)
    # The message says where the value sat and what to do about it.
    if how == "kwarg":
        assert "kwargs['thing']" in message
    if how == "nested":
        assert "kwargs['meta']['ids'][1]['deep']" in message
    if kind == "naive-datetime":
        assert "aware" in message
    elif kind in ("nan", "infinity"):
        assert "NaN or infinity" in message
    elif kind == "dict-non-str-key":
        assert "str keys" in message
    else:
        assert "Pass JSON values" in message
        assert "primary key" in message


def test_encode_error_names_the_type():
    with pytest.raises(PayloadError, match="has type set"):
        encode({1})
    with pytest.raises(PayloadError, match="has type Point"):
        encode(Point(1, 2))


# -- field report B13 -------------------------------------------------------------------------


@task(name="enq.fr.record")
def record(**kw):
    RECEIVED.append(((), kw))


@pytest.mark.django_db
def test_b13_payload_round_trip(clock, burst):
    when = datetime(2024, 2, 29, 18, 30, 15, 123456, tzinfo=BERLIN)
    ref, inner = uuid.uuid4(), uuid.uuid4()
    job = record.delay(
        amount=Decimal("1234567890.123456789"),
        when=when,
        ref=ref,
        day=date(2024, 2, 29),
        at=time(23, 59, 59, 999999),
        span=timedelta(days=1, microseconds=1),
        pair=(1, "a"),
        meta={"price": Decimal("0.10"), "ids": [inner]},
    )
    burst()
    assert Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL
    [(_, got)] = RECEIVED
    assert type(got["amount"]) is Decimal and str(got["amount"]) == "1234567890.123456789"
    assert type(got["ref"]) is uuid.UUID and got["ref"] == ref
    assert (got["day"], got["at"], got["span"]) == (date(2024, 2, 29), time(23, 59, 59, 999999), timedelta(days=1, microseconds=1))  # fmt: skip
    assert got["pair"] == [1, "a"]
    assert str(got["meta"]["price"]) == "0.10" and got["meta"]["ids"] == [inner]
    assert type(got["meta"]["ids"][0]) is uuid.UUID
    # Aware, same instant, same UTC offset (+01:00); the zone object becomes a fixed offset.
    assert got["when"] == when and got["when"].utcoffset() == timedelta(hours=1)
    assert got["when"].tzinfo is not None

    with tempfile.TemporaryFile() as handle:
        for bad in (Point(1, 2), {1, 2}, handle, lambda: 1, Order.objects.create(name="o")):
            count = Job.objects.count()
            with pytest.raises(PayloadError) as info:
                record.delay(value=bad)
            assert isinstance(info.value, TypeError)
            assert "kwargs['value']" in str(info.value) and "Pass JSON values" in str(info.value)
            assert Job.objects.count() == count
