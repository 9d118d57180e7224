"""The array text the ledger sends PostgreSQL for a many-row statement (pure; the round trip through
a real server is in tests/integration/test_ledger_bookkeeping.py)."""

from __future__ import annotations

from airflow_kafka_backpressure.ledger.bulk import _array_text


def test_numbers_and_nulls_are_bare():
    assert _array_text([1, None, -3, 0]) == "{1,NULL,-3,0}"


def test_strings_are_quoted_with_backslash_and_quote_escaped():
    assert _array_text(['a"b', "c\\d", "e,f", "{g}", "NULL", " h "]) == (
        '{"a\\"b","c\\\\d","e,f","{g}","NULL"," h "}'
    )


def test_repeated_values_keep_their_order():
    assert _array_text(["x", "y", "x", None, "x"]) == '{"x","y","x",NULL,"x"}'


def test_no_values_is_an_empty_array():
    assert _array_text([]) == "{}"
