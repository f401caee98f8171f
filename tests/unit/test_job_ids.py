"""The one 64-bit id guard (``django_debounce.job_ids``)."""

from __future__ import annotations

from django_debounce.job_ids import MAX_ID, is_storable_id, storable_ids


def test_only_positive_signed_64_bit_ids_can_name_a_row():
    assert MAX_ID == 9223372036854775807
    assert [is_storable_id(pk) for pk in (-1, 0, 1, MAX_ID, MAX_ID + 1)] == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert storable_ids([5, 2**63, 0, 3, -7, MAX_ID]) == [5, 3, MAX_ID]
