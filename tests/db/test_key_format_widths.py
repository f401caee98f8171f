"""Key templates whose format widths would allocate more than a key may hold (issue #17
follow-up 4; decision 165): refused at declaration (a literal width) or before formatting
(a width an argument supplies), never a ``MemoryError`` or a 300 MB string."""

from __future__ import annotations

import pytest

from django_debounce import debounced_task, task
from django_debounce.exceptions import ConfigurationError, KeyResolutionError
from django_debounce.models import Job

HUGE = 99_999_999_999


def _window(**options):
    return debounced_task(debounce="10s", debounce_max_wait="1m", **options)


@pytest.mark.parametrize(
    ("option", "template", "field"),
    [
        ("debounce_key", "{0:>99999999999}", "{0}"),
        ("debounce_key", "k:{x:>300000000}", "{x}"),
        ("debounce_key", "{0:.5000f}", "{0}"),
        ("debounce_key", "{0:4097}", "{0}"),
        ("debounce_key", "{0:>١٠٠٠٠٠٠٠٠٠}", "{0}"),  # format() reads Arabic-Indic digits too
        ("unique_key", "{0[id]:09999999}", "{0[id]}"),
    ],
)
def test_a_literal_width_past_the_key_limit_is_refused_at_declaration(option, template, field):
    decorate = _window if option == "debounce_key" else task

    with pytest.raises(ConfigurationError) as raised:

        @decorate(**{option: template})
        def wide(x):
            pass

    name = f"{__name__}.test_a_literal_width_past_the_key_limit_is_refused_at_declaration.<locals>.wide"
    assert str(raised.value).startswith(f"task {name!r}: {option} template {template!r} gives ")
    assert f"{field} a width or precision of " in str(raised.value)
    assert str(raised.value).endswith("keys are at most 4096 characters.")


@_window(debounce_key="{0:05d}|{0:.2f}|{0:9>10}|{0:,}")
def fine_widths(x):
    pass


@_window(debounce_key="{0:>4096}")
def widest(x):
    pass


@_window(debounce_key="w:{0:>{1}}")
def nested_width(text, width):
    pass


@_window(debounce_key="p:{0:.{precision}f}")
def nested_precision(value, precision=2):
    pass


@pytest.mark.django_db
def test_widths_up_to_the_key_limit_still_format(clock):
    assert fine_widths.delay(7).debounce_key == "00007|7.00|9999999997|7"
    assert widest.delay("x").debounce_key == " " * 4095 + "x"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task_obj", "args", "shown"),
    [
        (nested_width, ("a", HUGE), f"{HUGE}"),
        (nested_width, ("a", str(HUGE)), f"{HUGE}"),
        (nested_width, ("a", "<300000000"), "300000000"),
        (nested_precision, (1.5, 5000), "5000"),
    ],
)
def test_a_width_supplied_by_an_argument_is_refused_before_formatting(
    django_assert_num_queries, task_obj, args, shown
):
    """``{0:{1}}`` let the caller choose the allocation: ``MemoryError``, or 300 MB."""
    with django_assert_num_queries(0), pytest.raises(KeyResolutionError) as raised:
        task_obj.delay(*args)

    assert str(raised.value).startswith(f"enqueue of {task_obj.name!r}: key template ")
    assert f"a width or precision of {shown}" in str(raised.value)
    assert "keys are at most 4096 characters" in str(raised.value)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_nested_width_within_the_limit_formats(clock):
    assert nested_width.delay("a", 3).debounce_key == "w:  a"
    assert nested_precision.delay(1.25, precision=1).debounce_key == "p:1.2"


@pytest.mark.django_db
def test_a_calls_own_template_is_held_to_the_same_rule(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ConfigurationError) as raised:
        nested_width.apply_async(args=["a", 1], debounce_key="{0:>99999999999}")
    assert "debounce_key template '{0:>99999999999}' gives {0} a width" in str(raised.value)
