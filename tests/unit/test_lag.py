"""Lag, seconds behind and retention risk per partition (pure definitions in ``lag.py``)."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.kafka.lag import LagReport, LagThresholds, measure_lag, partition_lag

TP = TopicPartition("orders", 3)
NOW = 1_000_000


def _lag(**kw):
    args = dict(
        earliest=0,
        latest=100,
        committed=40,
        head=70,
        starting_offsets="earliest",
        retention_margin_records=0,
        now_ms=NOW,
    )
    args.update(kw)
    return partition_lag(TP, **args)


def test_position_is_the_committed_offset_and_lag_counts_from_it():
    p = _lag()
    assert (p.position, p.position_source, p.lag, p.in_flight, p.retention_margin, p.lost) == (
        40,
        "committed",
        60,
        30,
        40,
        0,
    )


@pytest.mark.parametrize("policy, position", [("earliest", 10), ("latest", 100)])
def test_a_partition_never_committed_counts_from_where_the_pipeline_starts(policy, position):
    p = _lag(earliest=10, committed=None, head=None, starting_offsets=policy)
    assert (p.position, p.position_source, p.lag, p.in_flight) == (
        position,
        f"starting_offsets={policy}",
        100 - position,
        None,
    )


def test_seconds_behind_is_the_age_of_the_oldest_unwritten_record():
    assert _lag(timestamp_ms=NOW - 2500).seconds_behind == 2.5
    assert _lag(timestamp_ms=NOW - 2500).oldest_unwritten_ts_ms == NOW - 2500
    assert _lag(timestamp_ms=None).seconds_behind is None  # unknown, not zero
    assert _lag(timestamp_ms=-1).seconds_behind is None  # a record without timestamp
    assert _lag(committed=100, timestamp_ms=None).seconds_behind == 0.0  # nothing unwritten


def test_retention_risk_needs_unread_data_within_the_margin():
    assert _lag(earliest=35, retention_margin_records=5).at_risk  # 40 - 35 = 5 <= 5
    assert not _lag(earliest=34, retention_margin_records=5).at_risk
    assert not _lag(earliest=100, latest=100, committed=100).at_risk  # nothing to lose
    lost = _lag(earliest=55)
    assert lost.at_risk and lost.lost == 15 and lost.retention_margin == -15


def _report(*parts):
    return LagReport("p", "g", NOW, 0, tuple(parts))


def test_thresholds_fire_on_total_lag_max_age_and_retention_each_with_a_reason():
    a = _lag(timestamp_ms=NOW - 10_000)
    b = partition_lag(
        TopicPartition("orders", 4),
        earliest=0,
        latest=50,
        committed=0,
        head=None,
        starting_offsets="earliest",
        retention_margin_records=0,
        timestamp_ms=NOW - 1000,
        now_ms=NOW,
    )
    report = _report(a, b)
    assert (
        report.total_lag == 110
        and report.max_seconds_behind == 10.0
        and [p.tp for p in report.at_risk] == [b.tp]
    )
    assert LagThresholds(max_lag_records=110).crossed(report) == []
    (why,) = LagThresholds(max_lag_records=109).crossed(report)
    assert "110 records" in why and "max_lag_records=109" in why
    (why,) = LagThresholds(max_seconds_behind=5).crossed(report)
    assert why.startswith("orders-3:") and "10 s" in why
    (why,) = LagThresholds(retention_margin_records=0).crossed(report)
    assert why.startswith("orders-4:") and "earliest retained offset 0" in why
    assert len(LagThresholds(retention_margin_records=40).crossed(report)) == 2


@pytest.mark.parametrize(
    "kw", [{}, {"max_lag_records": -1}, {"max_seconds_behind": "5"}, {"retention_margin_records": True}]
)
def test_thresholds_are_checked(kw):
    with pytest.raises(ValueError):
        LagThresholds(**kw)


class _Broker:
    """Offsets as a broker reports them; timestamps only for what is asked."""

    def __init__(self):
        self.asked = None

    def partitions(self, topics):
        return [TopicPartition(t, p) for t in topics for p in (0, 1)]

    def earliest_offsets(self, tps):
        return dict.fromkeys(tps, 0)

    def latest_offsets(self, tps):
        return dict.fromkeys(tps, 10)

    def committed_offsets(self, group, tps):
        return {tps[1]: 10}

    def record_timestamps(self, offsets):
        self.asked = dict(offsets)
        return dict.fromkeys(offsets, NOW - 3000)


def test_measure_lag_reads_timestamps_only_for_partitions_with_lag():
    broker = _Broker()
    report = measure_lag(
        broker, None, pipeline="p", topics=["t"], group="g", with_timestamps=True, now_ms=NOW
    )
    assert broker.asked == {TopicPartition("t", 0): 0}
    assert [p.seconds_behind for p in report.partitions] == [3.0, 0.0]
    assert report.to_dict()["total_lag"] == 10
