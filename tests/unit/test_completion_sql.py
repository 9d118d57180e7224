"""The read counts' aggregates as Spark SQL text (sinks.completion): what each counts, and that a
topic name reaches the parser as a literal whatever it holds."""

from __future__ import annotations

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks.completion import key_value_bytes, range_counts


def test_one_topic_compares_the_partition_only() -> None:
    ranges = [OffsetRange("orders", 3, 0, 10), OffsetRange("orders", 7, 5, 9)]
    assert range_counts(ranges) == [
        "count(CASE WHEN `partition` = 3 THEN 1 END) AS `n0`",
        "count(CASE WHEN `partition` = 7 THEN 1 END) AS `n1`",
    ]


def test_several_topics_compare_the_topic_too_as_a_literal() -> None:
    ranges = [OffsetRange("a.b-c_d", 0, 0, 1), OffsetRange("x", 0, 0, 1)]
    got = range_counts(ranges)
    assert got[0] == "count(CASE WHEN `partition` = 0 AND `topic` = 'a.b-c_d' THEN 1 END) AS `n0`"
    assert got[1].endswith("AND `topic` = 'x' THEN 1 END) AS `n1`")


def test_no_ranges_no_aggregates() -> None:
    assert range_counts([]) == []


def test_key_value_bytes_counts_a_null_as_zero() -> None:
    assert key_value_bytes() == "coalesce(length(`key`), 0) + coalesce(length(`value`), 0)"
