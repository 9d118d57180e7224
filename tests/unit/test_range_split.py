"""Offset ranges → input partitions: Spark's Kafka source cases and hypothesis properties."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.spark.range_split import group_pieces, split_evenly, split_ranges


def R(p: int, a: int, b: int, topic: str = "t") -> OffsetRange:
    return OffsetRange(topic, p, a, b)


# --------------------------------------------------------------------------- Spark's cases


def test_without_options_each_non_empty_range_is_one_partition():
    ranges = [R(0, 1, 2), R(1, 5, 5), R(2, 0, 1_000_000)]
    assert split_ranges(ranges) == [R(0, 1, 2), R(2, 0, 1_000_000)]


def test_min_partitions_already_met_changes_nothing():
    ranges = [R(0, 1, 2), R(1, 1, 2), R(2, 1, 2)]
    assert split_ranges(ranges, min_partitions=3) == ranges
    assert split_ranges(ranges, min_partitions=2) == ranges


def test_min_partitions_splits_one_partition_evenly():
    assert split_ranges([R(0, 1, 17)], min_partitions=4) == [
        R(0, 1, 5),
        R(0, 5, 9),
        R(0, 9, 13),
        R(0, 13, 17),
    ]


def test_min_partitions_splits_skewed_partitions_proportionally():
    # sizes 4 and 20, 3 partitions: 4/24*3 = 0.5 rounds (half up) to 1 -> unsplit; the other
    # range takes the remaining 2
    assert split_ranges([R(0, 1, 5), R(1, 1, 21)], min_partitions=3) == [
        R(0, 1, 5),
        R(1, 1, 11),
        R(1, 11, 21),
    ]


def test_empty_ranges_are_dropped_and_the_rest_split_with_remainders_last():
    assert split_ranges([R(0, 1, 1), R(1, 1, 21)], min_partitions=3) == [
        R(1, 1, 7),
        R(1, 7, 14),
        R(1, 14, 21),
    ]


def test_max_records_per_partition_caps_every_piece():
    assert split_ranges([R(0, 0, 10), R(1, 0, 3)], max_records_per_partition=4) == [
        R(0, 0, 3),
        R(0, 3, 6),
        R(0, 6, 10),
        R(1, 0, 3),
    ]


def test_max_records_first_then_min_partitions():
    # 10 offsets capped at 5 -> two pieces of 5; minPartitions=4 then splits each in two
    out = split_ranges([R(0, 0, 10)], min_partitions=4, max_records_per_partition=5)
    assert out == [R(0, 0, 2), R(0, 2, 5), R(0, 5, 7), R(0, 7, 10)]


def test_min_partitions_is_a_real_minimum_where_spark_rounds_below_it():
    # Spark: 5/15*4 = 1.33 -> 1 piece each, 3 < 4. Here the largest (first) piece is halved.
    out = split_ranges([R(0, 0, 5), R(1, 0, 5), R(2, 0, 5)], min_partitions=4)
    assert out == [R(0, 0, 2), R(0, 2, 5), R(1, 0, 5), R(2, 0, 5)]


def test_min_partitions_beyond_the_offsets_gives_one_offset_per_piece():
    assert split_ranges([R(0, 7, 10)], min_partitions=10) == [R(0, 7, 8), R(0, 8, 9), R(0, 9, 10)]


def test_no_ranges():
    assert split_ranges([], min_partitions=3, max_records_per_partition=2) == []
    assert split_ranges([R(0, 4, 4)], min_partitions=3) == []


@pytest.mark.parametrize(
    "kwargs", [{"min_partitions": 0}, {"max_records_per_partition": -1}, {"min_partitions": 1.5}]
)
def test_bad_options_are_named(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        split_ranges([R(0, 0, 1)], **kwargs)


def test_split_evenly_sizes_differ_by_at_most_one():
    assert [r.count for r in split_evenly(R(0, 0, 10), 3)] == [3, 3, 4]
    assert split_evenly(R(0, 0, 2), 5) == [R(0, 0, 1), R(0, 1, 2)]


# --------------------------------------------------------------------------- properties

sizes = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5_000)), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    spec=sizes,
    min_partitions=st.none() | st.integers(1, 64),
    max_records=st.none() | st.integers(1, 3_000),
)
def test_splits_cover_every_range_exactly_once_within_bounds(spec, min_partitions, max_records):
    ranges = [R(p, start, start + size) for p, (start, size) in enumerate(spec)]
    out = split_ranges(ranges, min_partitions=min_partitions, max_records_per_partition=max_records)

    pieces = defaultdict(list)
    for piece in out:
        assert piece.count > 0
        pieces[piece.tp].append(piece)
    for r in ranges:
        mine = pieces.pop(r.tp, [])
        if r.count == 0:
            assert mine == []
            continue
        # in order, contiguous, no overlap, exactly [from, until)
        assert mine[0].from_offset == r.from_offset and mine[-1].until_offset == r.until_offset
        assert all(a.until_offset == b.from_offset for a, b in zip(mine, mine[1:]))
        if max_records is not None:
            assert all(p.count <= max_records for p in mine)
    assert not pieces
    total = sum(r.count for r in ranges)
    non_empty = sum(1 for r in ranges if r.count)
    if min_partitions is not None:
        assert len(out) >= min(min_partitions, total)
    if min_partitions is None and max_records is None:
        assert out == [r for r in ranges if r.count]
    if max_records is None and min_partitions is not None and non_empty >= min_partitions:
        assert out == [r for r in ranges if r.count]


def test_pieces_beyond_the_slots_share_tasks_evenly_and_each_piece_is_in_one_group():
    pieces = [
        OffsetRange("t", 0, 0, 10),
        OffsetRange("t", 1, 0, 40),
        OffsetRange("t", 2, 0, 20),
        OffsetRange("t", 3, 0, 30),
    ]
    # largest first, each to the group with the fewest offsets: 40 | 30 | then 20 -> the 30, 10 -> the 40
    assert group_pieces(pieces, 2) == [[0, 1], [2, 3]]
    assert group_pieces(pieces, 3) == [[0, 2], [1], [3]]  # 40 | 30 | 20, then 10 -> the 20
    assert (
        group_pieces(pieces, None)
        == group_pieces(pieces, 4)
        == group_pieces(pieces, 9)
        == [[0], [1], [2], [3]]
    )
    assert group_pieces(pieces, 1) == [[0, 1, 2, 3]] and group_pieces([], 2) == []


@pytest.mark.parametrize("slots", [0, -1, 1.5, True])
def test_bad_slots_are_named(slots):
    with pytest.raises(ValueError, match="slots must be a positive integer"):
        group_pieces([OffsetRange("t", 0, 0, 1)], slots)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 1000), max_size=30), st.integers(1, 12))
def test_groups_cover_every_piece_once_and_stay_within_the_largest_piece_of_each_other(sizes, slots):
    pieces = [OffsetRange("t", i, 0, n) for i, n in enumerate(sizes)]
    groups = group_pieces(pieces, slots)
    assert sorted(i for g in groups for i in g) == list(range(len(pieces)))
    assert len(groups) == min(slots, len(pieces)) and all(g == sorted(g) for g in groups)
    loads = [sum(pieces[i].count for i in g) for g in groups]
    if loads:  # greedy largest-first: no group exceeds another by more than the largest piece
        assert max(loads) - min(loads) <= max(sizes)
