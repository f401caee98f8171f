"""The one 64-bit id guard (``django_debounce.job_ids``)."""

from __future__ import annotations

from django_debounce.job_ids import MAX_ID, is_storable_id, parse_id, storable_ids


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


def test_parse_id_takes_ascii_decimal_ids_in_range_and_nothing_else():
    assert [parse_id(v) for v in (7, "7", " 42\n", str(MAX_ID), MAX_ID)] == [
        7,
        7,
        42,
        MAX_ID,
        MAX_ID,
    ]
    # Unicode digits pass str.isdigit(): '²' makes int() raise, '١' (Arabic-Indic one) reads as 1.
    unicode_digits = ["²", "١", "٣٤", "１２", "⑦"]
    assert all(text.isdigit() for text in unicode_digits)
    out_of_range = ["9" * 5000, str(MAX_ID + 1), "0", "00", 0, -1, MAX_ID + 1, 10**5000]
    not_ids = ["", " ", "-3", "+3", "1.5", "1_000", "0x10", True, False, None, 1.0, b"7", [7]]
    assert [parse_id(v) for v in unicode_digits + out_of_range + not_ids] == [None] * (
        len(unicode_digits) + len(out_of_range) + len(not_ids)
    )
