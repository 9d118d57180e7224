"""The read counts' aggregates as Spark SQL text (sinks.completion): what each counts, that a
topic name reaches the parser as a literal whatever it holds, and how a batch of many ranges
is read back per range."""

from __future__ import annotations

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks.completion import (
    PER_RANGE_AGGREGATES,
    key_value_bytes,
    range_counts,
    range_records,
    read_count_aggregates,
)


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


def _ranges(n: int, size: int = 10) -> list[OffsetRange]:
    return [OffsetRange("t", p, 5, 5 + size) for p in range(n)]


def test_up_to_the_bound_each_range_has_its_aggregate_and_its_count() -> None:
    ranges = _ranges(PER_RANGE_AGGREGATES)
    assert read_count_aggregates(ranges) == range_counts(ranges)
    got = {f"n{i}": i for i in range(len(ranges))}
    assert range_records(ranges, got, recount=_no_recount) == list(range(len(ranges)))


def test_above_the_bound_one_count_of_every_row() -> None:
    assert read_count_aggregates(_ranges(PER_RANGE_AGGREGATES + 1)) == ["count(1) AS `n`"]


def test_a_total_equal_to_the_plan_gives_each_range_its_size_without_a_recount() -> None:
    ranges = _ranges(PER_RANGE_AGGREGATES + 1, size=7)
    got = {"n": 7 * len(ranges)}
    assert range_records(ranges, got, recount=_no_recount) == [7] * len(ranges)


def test_a_smaller_total_is_recounted_per_range_and_a_range_not_seen_has_none() -> None:
    ranges = _ranges(PER_RANGE_AGGREGATES + 1, size=7)
    seen = {r.tp: 6 for r in ranges[1:]}
    got = {"n": 6 * (len(ranges) - 1)}
    assert range_records(ranges, got, recount=lambda: seen) == [0] + [6] * (len(ranges) - 1)
    assert range_records(ranges, {"n": None}, recount=dict) == [0] * len(ranges)


def _no_recount() -> dict:
    raise AssertionError("recounted although the aggregates told every range's records")
