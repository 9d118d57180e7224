"""Pure parts of the range reader: Arrow batches, client choice, Data Source options."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.kafka.config import KafkaConfigError
from airflow_kafka_backpressure.spark import range_clients
from airflow_kafka_backpressure.spark.kafka_arrow import (
    HEADERS_TYPE,
    KAFKA_ARROW_SCHEMA,
    headers_array,
    kafka_record_batch,
    key_value_bytes,
)
from airflow_kafka_backpressure.spark.range_clients import (
    KafkaRangeReadError,
    check_reader_config,
    confluent_consumer_config,
    kafka_python_consumer_config,
    resolve_client,
)

# --------------------------------------------------------------------------- Arrow


def test_record_batch_has_spark_schema_and_values():
    batch = kafka_record_batch(
        "t",
        3,
        keys=[b"k0", None, b"k2"],
        values=[b"v0", b"v1", None],
        offsets=[10, 11, 12],
        timestamp_ms=[1_700_000_000_123, None, -1],
        timestamp_type=[0, None, 1],
        headers=[None, [("h", b"x"), ("e", None)], []],
    )
    assert batch.schema.equals(KAFKA_ARROW_SCHEMA, check_metadata=True)
    rows = batch.to_pylist()
    assert [r["key"] for r in rows] == [b"k0", None, b"k2"]
    assert [r["value"] for r in rows] == [b"v0", b"v1", None]
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}
    assert [r["offset"] for r in rows] == [10, 11, 12]
    assert rows[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    # no timestamp: -1 ms and type -1, as Spark shows Kafka's NO_TIMESTAMP
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, -1000, -1000]
    assert [r["timestampType"] for r in rows] == [0, -1, 1]
    assert rows[0]["headers"] is None and rows[2]["headers"] is None  # none or empty -> null
    assert rows[1]["headers"] == [{"key": "h", "value": b"x"}, {"key": "e", "value": None}]
    assert key_value_bytes(batch) == 2 + 2 + 2 + 2  # k0 v0 v1 k2


def test_headers_without_any_header_are_one_null_array():
    arr = headers_array([None, [], None])
    assert arr.type == HEADERS_TYPE and arr.null_count == 3


def test_empty_batch():
    batch = kafka_record_batch(
        "t", 0, keys=[], values=[], offsets=[], timestamp_ms=[], timestamp_type=[], headers=[]
    )
    assert batch.num_rows == 0 and batch.schema.equals(KAFKA_ARROW_SCHEMA) and key_value_bytes(batch) == 0


# --------------------------------------------------------------------------- clients


def test_auto_prefers_confluent_and_falls_back_to_kafka_python(monkeypatch):
    assert resolve_client("kafka-python") == "kafka-python"
    assert resolve_client("auto") == "confluent"  # installed with the test extra
    monkeypatch.setattr(range_clients, "confluent_available", lambda: False)
    assert resolve_client("auto") == "kafka-python"
    with pytest.raises(KafkaRangeReadError, match=r"confluent-kafka is not installed.*\[confluent\]"):
        resolve_client("confluent", source="reading t-0[0, 5)")
    with pytest.raises(
        ValueError, match=r"client must be one of \['auto', 'confluent', 'kafka-python'\], got 'rdkafka'"
    ):
        resolve_client("rdkafka")


def test_consumer_configs_read_without_group_commits_or_topic_creation():
    props = {"bootstrap.servers": "h:1", "group.id": "theirs", "enable.auto.commit": "true"}
    kp = kafka_python_consumer_config(props, source="s")
    assert kp["group_id"] is None and kp["enable_auto_commit"] is False
    assert kp["allow_auto_create_topics"] is False and kp["auto_offset_reset"] == "none"
    assert kp["isolation_level"] == "read_uncommitted"
    cf = confluent_consumer_config(props, source="s")
    assert cf["group.id"] == range_clients.READER_GROUP_ID  # required by confluent-kafka, never joined
    assert cf["enable.auto.commit"] is False and cf["enable.auto.offset.store"] is False
    assert cf["allow.auto.create.topics"] is False and cf["auto.offset.reset"] == "error"
    assert cf["isolation.level"] == "read_uncommitted"  # as kafka-python, Java and Spark
    # a connection's own settings win over the reader's defaults
    assert (
        confluent_consumer_config({**props, "isolation.level": "read_committed"}, source="s")[
            "isolation.level"
        ]
        == "read_committed"
    )
    assert (
        confluent_consumer_config({**props, "fetch.max.bytes": 1000}, source="s")["fetch.max.bytes"] == 1000
    )


def test_reader_config_is_checked_for_the_clients_auto_may_pick():
    check_reader_config({"bootstrap.servers": "h:1"}, "auto", source="src")
    with pytest.raises(KafkaConfigError, match=r"src: unsupported Kafka properties \['bogus'\]"):
        check_reader_config({"bootstrap.servers": "h:1", "bogus": 1}, "confluent", source="src")
    with pytest.raises(ValueError, match="src: client must be one of"):
        check_reader_config({"bootstrap.servers": "h:1"}, "java", source="src")


# --------------------------------------------------------------------------- Data Source options


def _reader(**options):
    from airflow_kafka_backpressure.spark.kafka_range_source import KafkaRangeReader, range_source_options

    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    opts = range_source_options(ranges, {"bootstrap.servers": "h:1"}, **options)
    return KafkaRangeReader(opts)


def test_partitions_follow_the_split_options():
    from airflow_kafka_backpressure.spark.kafka_range_source import DEFAULT_MAX_RECORDS_PER_PARTITION

    pieces = [p.offset_range for p in _reader().partitions()]
    assert pieces == [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 0, 10)]  # below the default cap
    assert DEFAULT_MAX_RECORDS_PER_PARTITION > 1000
    pieces = [p.offset_range for p in _reader(max_records_per_partition=400).partitions()]
    assert [(r.partition, r.count) for r in pieces] == [(0, 333), (0, 333), (0, 334), (1, 10)]
    pieces = [p.offset_range for p in _reader(min_partitions=5, max_records_per_partition=None).partitions()]
    assert len(pieces) >= 5 and sum(r.count for r in pieces) == 1010


def test_options_are_case_insensitive_and_checked_by_name():
    from airflow_kafka_backpressure.spark.kafka_range_source import KafkaRangeReader

    ranges = json.dumps([OffsetRange("t", 0, 0, 100).to_dict()])
    base = {"RANGES": ranges, "kafka.bootstrap.servers": "h:1"}
    r = KafkaRangeReader(
        {**base, "MINPARTITIONS": "4", "maxrecordsperpartition": "0", "Client": "kafka-python"}
    )
    assert r.min_partitions == 4 and r.max_records_per_partition is None and r.client == "kafka-python"
    assert len(r.partitions()) == 4
    for name, value in [("minPartitions", "0"), ("maxRecordsPerPartition", "-3"), ("pollTimeoutMs", "soon")]:
        with pytest.raises(ValueError, match=f"option '{name}' must be"):
            KafkaRangeReader({**base, name: value})
    with pytest.raises(ValueError, match="client must be one of"):
        KafkaRangeReader({**base, "client": "java"})
    with pytest.raises(KafkaConfigError, match=r"unsupported Kafka properties \['bootstrap.server'\]"):
        KafkaRangeReader({"ranges": ranges, "kafka.bootstrap.server": "h:1"})
