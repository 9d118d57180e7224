"""Per-partition planning: the maxMessagesPerPartition cases of Spark's DirectKafkaStreamSuite,
the rules Spark lacks (first positions, data loss, log end), and hypothesis invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_kafka_backpressure.batch.models import DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.control.allocation import (
    DataLossError,
    PlanningError,
    RateLimits,
    cap_records,
    clamp,
    max_messages_per_partition,
    plan_ranges,
)

T = "maxMessagesPerPartition"
P0, P1 = TopicPartition(T, 0), TopicPartition(T, 1)


def test_max_messages_with_backpressure_disabled():
    # batch 100 ms, maxRatePerPartition 100 -> 10 records each, whatever the lag
    mmp = max_messages_per_partition({P0: 0, P1: 0}, {P0: 50, P1: 50}, 100, RateLimits(100), None)
    assert mmp == {P0: 10, P1: 10}


def test_max_messages_with_no_lag():
    mmp = max_messages_per_partition({P0: 0, P1: 0}, {P0: 0, P1: 0}, 100, RateLimits(100), 100)
    assert mmp is None


def test_max_messages_respects_max_rate():
    limits = RateLimits(100, max_rate_overrides={P0: 50})
    mmp = max_messages_per_partition({P0: 0, P1: 0}, {P0: 1000, P1: 1000}, 100, limits, 1000)
    assert mmp == {P0: 5, P1: 10}


@pytest.mark.parametrize(
    "max_rate, initial_rate, expected",
    [(1000, 500, 250), (300, 1000, 150)],  # initialRate honours maxRatePerPartition; initialRate used
)
def test_backpressure_initial_rate(max_rate, initial_rate, expected):
    tp = TopicPartition("backpressure", 0)
    limits = RateLimits(max_rate, initial_rate=initial_rate)
    # backpressure on, no estimate yet (Spark's rate limit starts at -1)
    mmp = max_messages_per_partition({tp: 0}, {tp: 1000}, 500, limits, -1)
    assert mmp == {tp: expected}


def test_max_messages_with_zero_offset_and_rate_equal_to_the_minimum():
    tps = [TopicPartition("backpressure", p) for p in range(4)]
    current = dict.fromkeys(tps, 0)
    latest = dict(zip(tps, [0, 100, 200, 300]))
    mmp = max_messages_per_partition(current, latest, 60_000, RateLimits(100, 5), 1)
    assert mmp == dict(zip(tps, [5, 10, 20, 30]))


@pytest.mark.parametrize("rate, expected", [(100, 50), (50, 25), (20, 10)])
def test_using_rate_controller(rate, expected):
    # 1 partition, 5000 records, batch 500 ms, maxRatePerPartition 100: blocks of round(rate * 0.5)
    tp = TopicPartition("backpressure", 0)
    alloc = plan_ranges(
        {tp: 0}, {tp: 0}, {tp: 5000}, batch_interval_ms=500, limits=RateLimits(100), latest_rate=rate
    )
    assert alloc.ranges == (OffsetRange("backpressure", 0, 0, expected),)


def test_clamp_never_passes_latest():
    assert clamp({P0: 5, P1: 0}, {P0: 7, P1: 100}, {P0: 10, P1: 10}) == {P0: 7, P1: 10}
    assert clamp({P0: 5}, {P0: 7}, None) == {P0: 7}


def test_no_rate_and_no_caps_reads_to_latest():
    alloc = plan_ranges({P0: 3, P1: 0}, {P0: 0, P1: 0}, {P0: 9, P1: 4}, batch_interval_ms=1000)
    assert [r.until_offset for r in alloc.ranges] == [9, 4]
    assert not alloc.limited


def test_new_partitions_start_at_committed_else_policy():
    earliest = {P0: 10, P1: 10}
    latest = {P0: 50, P1: 60}
    a = plan_ranges({}, earliest, latest, batch_interval_ms=1000, committed={P0: 20})
    assert [(r.from_offset, r.until_offset) for r in a.ranges] == [(20, 50), (10, 60)]
    assert a.new_partitions == (P0, P1)
    b = plan_ranges({}, earliest, latest, batch_interval_ms=1000, starting_offsets="latest")
    assert [(r.from_offset, r.until_offset) for r in b.ranges] == [(50, 50), (60, 60)]
    # a partition added to a topic the pipeline already reads starts at its earliest offset, as in
    # Spark: starting_offsets is for a topic's first plan (at latest its first records would be lost)
    c = plan_ranges({P0: 30}, earliest, latest, batch_interval_ms=1000, starting_offsets="latest")
    assert [(r.from_offset, r.until_offset) for r in c.ranges] == [(30, 50), (10, 60)]
    assert c.new_partitions == (P1,)
    # another topic, new to the pipeline: the policy
    other = TopicPartition("another", 0)
    d = plan_ranges(
        {P0: 30},
        {**earliest, other: 5},
        {**latest, other: 70},
        batch_interval_ms=1000,
        starting_offsets="latest",
    )
    assert [(r.tp, r.from_offset) for r in d.ranges] == [(other, 70), (P0, 30), (P1, 10)]


def test_data_loss_fails_by_default_naming_the_partition_and_count():
    with pytest.raises(DataLossError, match=r"maxMessagesPerPartition-0: offsets \[5, 40\) \(35 records\)"):
        plan_ranges({P0: 5, P1: 40}, {P0: 40, P1: 0}, {P0: 90, P1: 90}, batch_interval_ms=1000)


def test_data_loss_skip_moves_to_earliest_and_records_it():
    a = plan_ranges(
        {P0: 5, P1: 40}, {P0: 40, P1: 0}, {P0: 90, P1: 90}, batch_interval_ms=1000, on_data_loss="skip"
    )
    assert a.data_loss == (DataLoss(T, 0, 5, 40),)
    assert a.data_loss[0].lost == 35
    assert a.ranges[0] == OffsetRange(T, 0, 40, 90)


def test_position_beyond_log_end_is_a_clear_error():
    with pytest.raises(
        PlanningError, match="beyond the end of the log.*maxMessagesPerPartition-0 at 80 > latest 50"
    ):
        plan_ranges({P0: 80}, {P0: 0}, {P0: 50}, batch_interval_ms=1000)


def test_partition_that_disappeared_is_a_clear_error():
    with pytest.raises(PlanningError, match="no longer lists them"):
        plan_ranges({P0: 1, P1: 1}, {P0: 0}, {P0: 5}, batch_interval_ms=1000)


def test_invalid_policies_are_refused():
    with pytest.raises(PlanningError, match="starting_offsets"):
        plan_ranges({}, {P0: 0}, {P0: 5}, batch_interval_ms=1000, starting_offsets="newest")
    with pytest.raises(PlanningError, match="on_data_loss"):
        plan_ranges({}, {P0: 0}, {P0: 5}, batch_interval_ms=1000, on_data_loss="ignore")


# ----- invariants -----------------------------------------------------------------------------
@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 6))
    tps = [TopicPartition("t", i) for i in range(n)]
    positions, earliest, latest = {}, {}, {}
    for tp in tps:
        e = draw(st.integers(0, 1_000))
        pos = draw(st.integers(e, e + 100_000))
        lat = draw(st.integers(pos, pos + 1_000_000))
        earliest[tp], positions[tp], latest[tp] = e, pos, lat
    limits = RateLimits(
        max_rate_per_partition=draw(st.sampled_from([0, 1, 10, 1000, 50_000])),
        min_rate_per_partition=draw(st.integers(0, 200)),
        initial_rate=draw(st.sampled_from([0, 100, 10_000])),
    )
    rate = draw(st.one_of(st.none(), st.just(-1), st.floats(0.5, 1e7)))
    interval = draw(st.integers(1, 600_000))
    return positions, earliest, latest, limits, rate, interval


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_ranges_never_go_backwards_nor_past_latest_and_stay_within_the_budget(s):
    positions, earliest, latest, limits, rate, interval = s
    a = plan_ranges(positions, earliest, latest, batch_interval_ms=interval, limits=limits, latest_rate=rate)
    assert {r.tp for r in a.ranges} == set(latest)
    for r in a.ranges:
        assert r.from_offset == positions[r.tp]  # continues exactly where the last range ended
        assert r.from_offset <= r.until_offset <= latest[r.tp]
    secs = interval / 1000
    floors = sum(max(limits.min_rate_per_partition, 0) for _ in a.ranges)
    if a.rate_limit is not None and a.limited:
        assert a.records <= secs * a.rate_limit + floors + 1e-6 * a.records
    if limits.max_rate_per_partition > 0:
        for r in a.ranges:
            assert r.count <= max(int(secs * limits.max_rate_per_partition), limits.min_rate_per_partition)
    if not a.limited:
        assert all(r.until_offset == latest[r.tp] for r in a.ranges)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_consecutive_plans_chain_without_gaps_or_overlaps(s):
    positions, earliest, latest, limits, rate, interval = s
    heads = dict(positions)
    seen: dict[TopicPartition, list[OffsetRange]] = {tp: [] for tp in latest}
    for _ in range(5):
        a = plan_ranges(heads, earliest, latest, batch_interval_ms=interval, limits=limits, latest_rate=rate)
        for r in a.ranges:
            seen[r.tp].append(r)
            heads[r.tp] = r.until_offset
    for rs in seen.values():
        for prev, nxt in zip(rs, rs[1:]):
            assert prev.until_offset == nxt.from_offset


# ----- max_records_per_batch (Structured Streaming's maxOffsetsPerTrigger) --------------------


def test_cap_shares_the_cap_in_proportion_and_hits_it_exactly():
    a, b, c = (TopicPartition("t", i) for i in range(3))
    current = {a: 0, b: 100, c: 5}
    until = {a: 10, b: 110, c: 15}  # 10 records each
    capped = cap_records(current, until, 20)
    counts = [capped[tp] - current[tp] for tp in (a, b, c)]
    assert sum(counts) == 20 and sorted(counts) == [6, 7, 7]
    assert cap_records(current, until, 30) == until  # at the cap: unchanged
    assert cap_records(current, until, 0) == until  # 0: no cap


def test_plan_ranges_applies_the_cap_after_sparks_rules():
    tps = [TopicPartition("t", i) for i in range(2)]
    limits = RateLimits(max_rate_per_partition=1000, max_records_per_batch=150)
    alloc = plan_ranges(
        {tp: 0 for tp in tps},
        {tp: 0 for tp in tps},
        {tps[0]: 10_000, tps[1]: 100},
        batch_interval_ms=1000,
        limits=limits,
        latest_rate=None,
    )
    # Spark's rules give 1000 and 100; the cap shares 150 in that proportion
    assert [r.count for r in alloc.ranges] == [136, 14] and alloc.limited
