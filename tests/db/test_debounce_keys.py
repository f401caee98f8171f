"""Debounce keys (contract §3): templates bind like the signature, scalars render, errors write nothing."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.db import transaction

from django_debounce import debounced_task, task
from django_debounce.exceptions import KeyResolutionError, PayloadError
from django_debounce.models import Job
from tests.conftest import T
from tests.testapp.models import Order


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


class Level(enum.IntEnum):
    HIGH = 3


class Color(enum.StrEnum):
    RED = "red"


def _window(**options):
    """Decorator: a 10 s / 1 m debounced task with the given options."""
    return debounced_task(debounce="10s", debounce_max_wait="1m", **options)


@_window(debounce_key="sync:{0}")
def sync_pos(account_id, region="eu"):
    pass


@_window(debounce_key="sync:{account_id}")
def sync_named(account_id, region="eu"):
    pass


@_window(debounce_key="sync:{account_id}:{region}:{1}")
def sync_defaults(account_id, region="eu"):
    pass


@_window(debounce_key="p:{payload[user_id]}")
def by_item(payload):
    pass


@_window(debounce_key="p:{0[id]}:{0[tags][1]}")
def by_index_item(record):
    pass


@_window(debounce_key="y:{when.year}-{when.month}")
def by_year(when):
    pass


@_window(debounce_key="r:{ref.hex}")
def by_hex(ref):
    pass


@_window(debounce_key="v:{value}")
def by_value(value):
    pass


@_window(debounce_key="tier:{tier}")
def by_tier(user_id, tier=Tier.GOLD):
    pass


@_window(debounce_key="x:{1}:{flag}:{extra}")
def variadic(first, *rest, flag=False, **more):
    pass


@_window(debounce_key="whole-task")
def one_window(x):
    pass


@_window()
def hashed_a(account_id, region="eu"):
    pass


@_window()
def hashed_b(account_id, region="eu"):
    pass


def _key_of(task, *args, **kwargs):
    job = task.delay(*args, **kwargs)
    return Job.objects.get(pk=job.pk).debounce_key


@pytest.mark.django_db
def test_position_and_name_bind_through_the_signature(clock):
    a = sync_pos.delay(5)
    b = sync_pos.delay(account_id=5)
    c = sync_pos.delay(5, "us")
    assert a.pk == b.pk == c.pk
    assert Job.objects.get(pk=a.pk).debounce_key == "sync:5"
    assert Job.objects.get(pk=a.pk).enqueue_count == 3
    d = sync_named.delay(5)
    e = sync_named.delay(account_id=5, region="us")
    assert d.pk == e.pk != a.pk
    assert Job.objects.get(pk=d.pk).debounce_key == "sync:5"


@pytest.mark.django_db
def test_defaults_are_applied(clock):
    jobs = [
        sync_defaults.delay(5),
        sync_defaults.delay(5, "eu"),
        sync_defaults.delay(5, region="eu"),
    ]
    assert {j.pk for j in jobs} == {jobs[0].pk}
    assert Job.objects.get(pk=jobs[0].pk).debounce_key == "sync:5:eu:eu"
    other = sync_defaults.delay(5, region="us")
    assert other.pk != jobs[0].pk
    assert other.debounce_key == "sync:5:us:us"


@pytest.mark.django_db
def test_an_enum_default_renders_by_value(clock):
    assert _key_of(by_tier, 1) == "tier:gold"
    # The value and the member share a window: both render "gold".
    assert by_tier.delay(2, "gold").pk == by_tier.delay(3).pk
    assert _key_of(by_tier, 1, "silver") == "tier:silver"
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_a_plain_enum_argument_is_a_key_scalar_but_not_a_payload(django_assert_num_queries):
    # §3 lists Enum members among key scalars; §5's codec does not store them, so
    # passing one explicitly is a PayloadError (raised after the key resolved).
    with django_assert_num_queries(0), pytest.raises(PayloadError, match="type Tier"):
        by_tier.delay(1, Tier.SILVER)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_item_and_attribute_access(clock):
    assert _key_of(by_item, {"user_id": 42, "other": [1]}) == "p:42"
    assert _key_of(by_index_item, {"id": 7, "tags": ["a", "b"]}) == "p:7:b"
    assert _key_of(by_year, date(2024, 2, 29)) == "y:2024-2"
    assert _key_of(by_year, datetime(2023, 12, 31, 23, 0, tzinfo=UTC)) == "y:2023-12"
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert _key_of(by_hex, ref) == "r:12345678123456781234567812345678"


@pytest.mark.django_db
def test_variadic_parameters_bind(clock):
    assert _key_of(variadic, 1, "second", flag=True, extra="e") == "x:second:True:e"


SCALARS = [
    pytest.param(5, "v:5", id="int"),
    pytest.param(-1.5, "v:-1.5", id="float"),
    pytest.param(1.0, "v:1.0", id="float-integral"),
    pytest.param(True, "v:True", id="bool"),
    pytest.param("text with spaces", "v:text with spaces", id="str"),
    pytest.param("", "v:", id="empty-str"),
    pytest.param(Decimal("1.10"), "v:1.10", id="decimal"),
    pytest.param(Decimal("1E+3"), "v:1E+3", id="decimal-exponent"),
    pytest.param(
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "v:12345678-1234-5678-1234-567812345678",
        id="uuid",
    ),
    pytest.param(date(2024, 2, 29), "v:2024-02-29", id="date"),
    pytest.param(
        datetime(2024, 2, 29, 10, 0, 0, 5, tzinfo=timezone(timedelta(hours=1))),
        "v:2024-02-29 10:00:00.000005+01:00",
        id="datetime",
    ),
    pytest.param(time(23, 59, 59, 999999), "v:23:59:59.999999", id="time"),
    pytest.param(Color.RED, "v:red", id="str-enum"),
    pytest.param(Level.HIGH, "v:3", id="int-enum"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("value", "expected"), SCALARS)
def test_every_scalar_renders_as_str(clock, value, expected):
    job = by_value.delay(value)
    assert job.outcome == "created"
    assert Job.objects.get(pk=job.pk).debounce_key == expected
    again = by_value.delay(value)
    assert (again.pk, again.outcome) == (job.pk, "debounced")


@pytest.mark.django_db
def test_decimal_texts_are_different_keys(clock):
    assert by_value.delay(Decimal("1.0")).pk != by_value.delay(Decimal("1.00")).pk
    # ... but a UUID and its canonical string share a window.
    u = uuid.uuid4()
    assert by_value.delay(u).pk == by_value.delay(str(u)).pk


@_window(debounce_key="report:{user}")
def missing_name(user_id):
    pass


@_window(debounce_key="sync:{2}")
def out_of_range(account_id, region="eu"):
    pass


@_window(debounce_key="k:{0}")
def first_arg(value, other=None):
    pass


@_window(debounce_key="k:{0[missing]}")
def missing_item(value):
    pass


@_window(debounce_key="k:{0.nope}")
def missing_attr(value):
    pass


@_window(debounce_key="k:{0.__class__}")
def private_attr(value):
    pass


@_window(debounce_key="k:{0!r}")
def conversion(value):
    pass


class _Thing:
    def __str__(self):
        return "thing"


def _order():
    return Order.objects.create(name="o")


BAD_KEYS = [
    pytest.param(missing_name, lambda: ((1,), {}), id="missing-name"),
    pytest.param(out_of_range, lambda: ((5,), {}), id="out-of-range-index"),
    pytest.param(first_arg, lambda: ((None,), {}), id="none"),
    pytest.param(first_arg, lambda: ((), {"value": None}), id="none-by-keyword"),
    pytest.param(first_arg, lambda: (({"id": 5},), {}), id="dict"),
    pytest.param(first_arg, lambda: (([1, 2],), {}), id="list"),
    pytest.param(first_arg, lambda: ((("a",),), {}), id="tuple"),
    pytest.param(first_arg, lambda: ((_order(),), {}), id="model-instance"),
    pytest.param(first_arg, lambda: ((_Thing(),), {}), id="object"),
    pytest.param(first_arg, lambda: (({1, 2},), {}), id="set-not-payload-error"),
    pytest.param(first_arg, lambda: ((lambda: 1,), {}), id="lambda-not-payload-error"),
    pytest.param(first_arg, lambda: ((b"x",), {}), id="bytes"),
    pytest.param(first_arg, lambda: ((timedelta(1),), {}), id="timedelta"),
    pytest.param(missing_item, lambda: (({"id": 5},), {}), id="missing-item"),
    pytest.param(missing_attr, lambda: ((5,), {}), id="missing-attribute"),
    pytest.param(private_attr, lambda: ((5,), {}), id="private-attribute"),
    pytest.param(conversion, lambda: ((5,), {}), id="conversion"),
    pytest.param(first_arg, lambda: ((), {}), id="required-argument-missing"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("task_obj", "make_call"), BAD_KEYS)
def test_key_resolution_error_writes_nothing(django_assert_num_queries, task_obj, make_call):
    args, kwargs = make_call()
    before = Job.objects.count()
    with django_assert_num_queries(0), pytest.raises(KeyResolutionError) as info:
        task_obj.delay(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, PayloadError)
    assert Job.objects.count() == before


@pytest.mark.django_db
def test_key_error_message_is_helpful():
    with pytest.raises(KeyResolutionError, match=r"\{user\}.*arguments: user_id") as info:
        missing_name.delay(1)
    # It names the call whose key failed (a new user's trial: key errors did not).
    assert str(info.value).startswith(f"enqueue of {missing_name.name!r}: "), info.value
    with pytest.raises(KeyResolutionError, match=r"only 2 positional"):
        out_of_range.delay(5)
    with pytest.raises(KeyResolutionError, match=r"resolved a placeholder to dict.*\{0\[id\]\}"):
        first_arg.delay({"id": 5})


@pytest.mark.django_db
def test_outer_atomic_stays_usable_after_a_key_error(clock):
    with transaction.atomic():
        Order.objects.create(name="before")
        with pytest.raises(KeyResolutionError):
            first_arg.delay({"id": 5})
        Order.objects.create(name="after")
        good = first_arg.delay(5)
    assert set(Order.objects.values_list("name", flat=True)) == {"before", "after"}
    assert list(Job.objects.values_list("pk", "debounce_key")) == [(good.pk, "k:5")]


@pytest.mark.django_db
def test_template_without_placeholder_is_one_window_per_task(clock):
    a = one_window.delay(1)
    b = one_window.delay(2)
    c = one_window.delay(x=3)
    assert a.pk == b.pk == c.pk
    row = Job.objects.get()
    assert (row.debounce_key, row.enqueue_count) == ("whole-task", 3)


def _user_key(user_id, *args, **kwargs):
    return None if user_id == 0 else f"u:{user_id}:{len(args)}:{sorted(kwargs)}"


@_window(debounce_key=_user_key)
def callable_key(user_id, *args, **kwargs):
    pass


@_window(debounce_key=lambda x: x)
def callable_returns_value(x):
    pass


@pytest.mark.django_db
def test_callable_key_takes_the_call_as_given(clock):
    job = callable_key.delay(7, "a", z=1)
    assert job.outcome == "created"
    assert Job.objects.get(pk=job.pk).debounce_key == "u:7:1:['z']"
    assert callable_key.delay(7, "b", z=2).pk == job.pk


@pytest.mark.django_db
def test_callable_key_returning_none_inserts_a_plain_job(clock, burst):
    window = callable_key.delay(7)
    first = callable_key.delay(0)
    second = callable_key.delay(0)
    assert first.outcome == second.outcome == "created"
    assert first.pk != second.pk
    for job in (first, second):
        row = Job.objects.get(pk=job.pk)
        assert row.run_at == T  # due at once
        assert (row.opened_at, row.max_run_at, row.debounce_key) == (None, None, None)
        assert not row.is_open_window
    burst()
    assert set(Job.objects.filter(status=Job.Status.SUCCESSFUL).values_list("pk", flat=True)) == {
        first.pk,
        second.pk,
    }
    assert Job.objects.get(pk=window.pk).status == Job.Status.READY


@pytest.mark.django_db
@pytest.mark.parametrize("value", [5, b"x", ["k"]])
def test_callable_key_must_return_str_or_none(django_assert_num_queries, value):
    with django_assert_num_queries(0), pytest.raises(KeyResolutionError, match="must be a str"):
        callable_returns_value.delay(value)
    assert Job.objects.count() == 0


def _broken_key(user_id):
    return {"a": 1}[user_id]  # KeyError for anything but "a"


@_window(debounce_key=_broken_key)
def broken_callable_key(user_id):
    pass


@task(unique_key=lambda x: 1 / 0)
def broken_unique_key(x):
    pass


@pytest.mark.django_db
def test_a_key_callable_that_raises_gives_key_resolution_error_chained(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(KeyResolutionError) as raised:
        broken_callable_key.delay("b")
    assert str(raised.value) == (
        f"enqueue of {broken_callable_key.name!r}: the debounce_key callable "
        "tests.db.test_debounce_keys._broken_key raised KeyError: 'b'"
    )
    cause = raised.value.__cause__  # the planner names the call; its cause names the callable
    assert isinstance(cause, KeyResolutionError) and isinstance(cause.__cause__, KeyError)
    with pytest.raises(KeyResolutionError) as raised:  # the same for a unique_key callable
        broken_unique_key.delay("x")
    assert str(raised.value).endswith(
        "the unique_key callable tests.db.test_debounce_keys.<lambda> raised "
        "ZeroDivisionError: division by zero"
    )
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["x" * 4094, "ü" * 4094])
def test_keys_up_to_4096_characters(clock, text):
    job = first_arg.delay(text)  # "k:" + 4094 characters = 4096
    assert Job.objects.get(pk=job.pk).debounce_key == "k:" + text
    assert first_arg.delay(text).pk == job.pk
    assert first_arg.delay(text[:-1] + "y").pk != job.pk


@pytest.mark.django_db
def test_longer_keys_are_refused(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(KeyResolutionError, match="4097"):
        first_arg.delay("x" * 4095)
    with pytest.raises(KeyResolutionError, match="4096"):
        callable_returns_value.delay("y" * 4097)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_default_key_hashes_the_bound_arguments(clock):
    a = hashed_a.delay(1)
    assert a.outcome == "created"
    assert hashed_a.delay(account_id=1).pk == a.pk
    assert hashed_a.delay(1, "eu").pk == a.pk
    assert hashed_a.delay(1, region="eu").pk == a.pk
    assert hashed_a.delay(2).pk != a.pk
    assert hashed_a.delay(1, "us").pk != a.pk
    # Same arguments on another task: its own window.
    b = hashed_b.delay(1)
    assert b.outcome == "created" and b.pk != a.pk
    row_a, row_b = Job.objects.get(pk=a.pk), Job.objects.get(pk=b.pk)
    assert row_a.enqueue_count == 4
    assert row_a.debounce_key == row_b.debounce_key  # same key text, different task
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_default_key_is_canonical(clock):
    # Dict order does not matter; a tuple and a list are the same payload.
    a = hashed_a.delay({"x": 1, "y": [1, 2]})
    assert hashed_a.delay({"y": (1, 2), "x": 1}).pk == a.pk
    assert hashed_a.delay({"x": 1, "y": [2, 1]}).pk != a.pk
    # Types that look alike as text stay apart in the hash.
    assert hashed_a.delay("1").pk != hashed_a.delay(1).pk


# -- field report B12 -------------------------------------------------------------------------


#: What the B12 tasks received (they run inline under ``--burst``).
RAN: list[tuple[str, tuple, dict]] = []


def _b12(label, key, **options):
    return debounced_task(
        name=f"enq.fr.{label}", debounce="5m", debounce_max_wait="30m", debounce_key=key, **options
    )


@_b12("report", "report:{user_id}")
def report(user_id):
    RAN.append(("report", (), {"user_id": user_id}))


@_b12("report_replace", "report:{user_id}", debounce_replace_payload=True)
def report_replace(user_id):
    RAN.append(("report_replace", (), {"user_id": user_id}))


@_b12("report_tier", "report:{tier}")
def report_tier(user_id, tier=Tier.GOLD):
    pass


U = uuid.UUID("12345678-1234-5678-1234-567812345678")


@pytest.mark.django_db
def test_b12_uuid_key_and_payload(clock, burst):
    RAN.clear()
    for task_obj in (report, report_replace):
        first = task_obj.apply_async(kwargs={"user_id": U})
        second = task_obj.apply_async(kwargs={"user_id": str(U)})
        assert (second.pk, second.outcome) == (first.pk, "debounced")
        assert (
            Job.objects.get(pk=first.pk).debounce_key
            == "report:12345678-1234-5678-1234-567812345678"
        )
        assert Job.objects.filter(task_name=task_obj.name).count() == 1
    # The report's UUID has no hex letters, so str(u).upper() is the same text:
    # it joins the window. With letters, the upper-case text is another key.
    assert report.apply_async(kwargs={"user_id": str(U).upper()}).outcome == "debounced"
    lettered = uuid.UUID("abcdef01-2345-6789-abcd-ef0123456789")
    lower = report.apply_async(kwargs={"user_id": lettered})
    upper = report.apply_async(kwargs={"user_id": str(lettered).upper()})
    assert (lower.outcome, upper.outcome) == ("created", "created")
    assert upper.debounce_key == "report:ABCDEF01-2345-6789-ABCD-EF0123456789"
    assert report.apply_async(kwargs={"user_id": str(lettered)}).pk == lower.pk
    clock(minutes=5)
    burst()
    assert RAN == [
        ("report", (), {"user_id": U}),
        ("report_replace", (), {"user_id": str(U)}),
        ("report", (), {"user_id": lettered}),
        ("report", (), {"user_id": str(lettered).upper()}),
    ]
    assert type(RAN[0][2]["user_id"]) is uuid.UUID
    assert Job.objects.filter(status=Job.Status.SUCCESSFUL).count() == 4

    scalars = [
        (5, "report:5"),
        (2.5, "report:2.5"),
        (True, "report:True"),
        (Decimal("1.10"), "report:1.10"),
        (date(2024, 2, 29), "report:2024-02-29"),
        (datetime(2024, 2, 29, 10, 0, tzinfo=UTC), "report:2024-02-29 10:00:00+00:00"),
        (time(23, 59, 59, 999999), "report:23:59:59.999999"),
        (Color.RED, "report:red"),
    ]
    ids = set()
    for value, text in scalars:
        job = report.delay(value)
        assert (job.outcome, job.debounce_key) == ("created", text)
        assert report.delay(value).pk == job.pk  # one window per value
        ids.add(job.pk)
    assert len(ids) == len(scalars)
    tier = report_tier.delay(1)
    assert (tier.debounce_key, report_tier.delay(2).pk) == ("report:gold", tier.pk)
