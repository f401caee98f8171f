"""The trace links a job carries stay bounded (decision 212): the first call's and the latest ones."""

from __future__ import annotations

from django_debounce.tracing import MAX_LINKS
from django_debounce.tracing.carriers import joined, links_of, opening


def _carrier(n: int) -> dict[str, str]:
    return {"traceparent": f"00-{n:032x}-{n:016x}-01"}


def _burst(calls: int) -> dict:
    stored = None
    for n in range(1, calls + 1):
        stored = joined(stored, opening(_carrier(n)))
    assert stored is not None
    return stored


def test_the_first_call_opens_the_links_with_its_carrier():
    assert joined(None, opening(_carrier(1))) == {"calls": 1, "links": [_carrier(1)]}


def test_calls_up_to_the_bound_are_all_kept_in_order():
    stored = _burst(MAX_LINKS)
    assert stored["calls"] == MAX_LINKS == 32
    assert stored["links"] == [_carrier(n) for n in range(1, 33)]
    assert links_of(stored) == ([_carrier(n) for n in range(1, 33)], 0)


def test_past_the_bound_the_first_and_the_latest_are_kept_and_the_rest_counted():
    stored = _burst(10_000)
    links, left_out = links_of(stored)
    assert len(links) == MAX_LINKS
    assert links[0] == _carrier(1)
    assert links[1:] == [_carrier(n) for n in range(10_000 - 30, 10_001)]
    assert stored["calls"] == 10_000
    assert left_out == 10_000 - 32


def test_a_call_joining_a_job_opened_untraced_starts_its_links():
    assert joined({}, opening(_carrier(5))) == {"calls": 1, "links": [_carrier(5)]}


def test_a_stored_value_of_another_shape_reads_as_no_links():
    assert links_of(None) == ([], 0)
    assert links_of([1, 2]) == ([], 0)
    assert links_of({"links": "x"}) == ([], 0)
    assert links_of({"calls": "3", "links": [_carrier(1), 7]}) == ([_carrier(1)], 0)


def test_a_longer_stored_list_is_cut_back_to_the_bound():
    stored = {"calls": 40, "links": [_carrier(n) for n in range(1, 41)]}
    after = joined(stored, opening(_carrier(41)))
    assert len(after["links"]) == MAX_LINKS
    assert after["links"][0] == _carrier(1)
    assert after["links"][-1] == _carrier(41)
    assert after["calls"] == 41


def test_the_same_span_joining_again_adds_no_link_and_no_count():
    stored = joined(opening(_carrier(1)), opening(_carrier(2)))
    assert joined(stored, opening(_carrier(2))) == stored
