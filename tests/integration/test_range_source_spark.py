"""The range Data Source in real Spark (local[2]) with both Kafka clients against the embedded broker."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.spark.kafka_range_source import (
    KAFKA_SCHEMA,
    SOURCE_NAME,
    KafkaRangeDataSource,
    range_source_options,
)
from airflow_kafka_backpressure.spark.range_split import split_ranges
from kbp_local.producer import ensure_topic, produce

from .kafka_samples import SAMPLE_TIMESTAMPS_MS, produce_sample_records


@pytest.fixture(params=["confluent", "kafka-python"])
def client(request) -> str:
    return request.param


def load(spark, ranges, bootstrap, **options):
    spark.dataSource.register(KafkaRangeDataSource)
    opts = range_source_options(ranges, {"bootstrap.servers": bootstrap}, **options)
    return spark.read.format(SOURCE_NAME).options(**opts).load()


def test_split_ranges_are_read_in_parallel_and_exactly_once(spark, kafka_broker, topic_name, client):
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=60, partitions=2)  # 30 per partition
    ranges = [OffsetRange(topic_name, 0, 0, 30), OffsetRange(topic_name, 1, 5, 25)]
    df = load(
        spark, ranges, kafka_broker.bootstrap, client=client, max_records_per_partition=7, min_partitions=9
    )
    assert df.schema == KAFKA_SCHEMA

    expected_pieces = split_ranges(ranges, max_records_per_partition=7, min_partitions=9)
    assert len(expected_pieces) >= 9
    assert df.rdd.getNumPartitions() == len(expected_pieces)
    rows = df.select("partition", "offset", "value").collect()
    seen = Counter((r["partition"], r["offset"]) for r in rows)
    assert not [k for k, n in seen.items() if n > 1]  # no duplicates
    assert sorted(seen) == [(0, o) for o in range(30)] + [(1, o) for o in range(5, 25)]  # no gaps
    assert all(json.loads(r["value"])["id"] == r["offset"] * 2 + r["partition"] for r in rows)


def test_both_clients_give_spark_the_same_rows(spark, kafka_broker, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce_sample_records(kafka_broker.bootstrap, topic_name)
    ranges = [OffsetRange(topic_name, 0, 0, 3)]
    results = {
        c: sorted(load(spark, ranges, kafka_broker.bootstrap, client=c).collect(), key=lambda r: r["offset"])
        for c in ("confluent", "kafka-python")
    }
    assert results["confluent"] == results["kafka-python"]
    rows = results["confluent"]
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert [r["key"] for r in rows] == [b"k0", None, b"k2"]
    assert [(h["key"], h["value"]) for h in rows[1]["headers"]] == [("h", b"x"), ("e", b"")]
    assert rows[0]["headers"] is None
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == SAMPLE_TIMESTAMPS_MS


def test_a_bad_client_option_fails_the_query_at_planning(spark, kafka_broker, topic_name):
    with pytest.raises(Exception, match="client must be one of"):
        load(spark, [OffsetRange(topic_name, 0, 0, 1)], kafka_broker.bootstrap, client="java").collect()
