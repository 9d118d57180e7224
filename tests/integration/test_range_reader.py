"""The range reader with both Kafka clients against the real embedded broker (no Spark).

Every behaviour is checked for confluent-kafka and for kafka-python: exact ranges, records past
``until`` dropped, offset gaps from transaction markers, the Spark Kafka schema and values, the
stall / missing topic / unreachable broker / refused login errors, no commits, no topic creation,
and the completion hook.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA
from airflow_kafka_backpressure.spark.range_clients import READER_GROUP_ID
from airflow_kafka_backpressure.spark.range_reader import KafkaRangeReadError, read_range
from airflow_kafka_backpressure.spark.range_split import split_ranges
from kbp_local.process import free_port
from kbp_local.producer import ensure_topic, produce

from .kafka_samples import SAMPLE_TIMESTAMPS_MS, produce_sample_records

CLIENTS = ["confluent", "kafka-python"]
PARTITIONS = 4


@pytest.fixture(params=CLIENTS)
def client(request) -> str:
    return request.param


@pytest.fixture
def props(kafka_broker) -> dict:
    return {"bootstrap.servers": kafka_broker.bootstrap}


def read_table(r: OffsetRange, props: dict, client: str, **kwargs) -> pa.Table:
    batches = list(read_range(r, props, client=client, **kwargs))
    for b in batches:
        assert b.schema.equals(KAFKA_ARROW_SCHEMA)
    return pa.Table.from_batches(batches, schema=KAFKA_ARROW_SCHEMA)


def ids(table: pa.Table) -> list[int]:
    return [json.loads(v)["id"] for v in table.column("value").to_pylist()]


def topics(bootstrap: str) -> set[str]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def test_ranges_are_read_exactly_over_several_partitions(kafka_broker, props, client, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, PARTITIONS)
    produce(kafka_broker.bootstrap, topic_name, count=200, partitions=PARTITIONS)  # 50 per partition
    for p, (a, b) in enumerate([(0, 50), (3, 17), (49, 50), (20, 41)]):
        table = read_table(OffsetRange(topic_name, p, a, b), props, client, max_records_per_batch=7)
        assert table.column("offset").to_pylist() == list(
            range(a, b)
        )  # no gap, no duplicate, none past until
        assert ids(table) == [o * PARTITIONS + p for o in range(a, b)]
        assert set(table.column("partition").to_pylist()) == {p}

    # the pieces of a split read every offset exactly once
    whole = [OffsetRange(topic_name, p, 0, 50) for p in range(PARTITIONS)]
    pieces = split_ranges(whole, max_records_per_partition=9, min_partitions=8)
    assert len(pieces) > len(whole)
    seen = [i for piece in pieces for i in ids(read_table(piece, props, client))]
    assert sorted(seen) == list(range(200))


def test_batches_hold_at_most_max_records(kafka_broker, props, client, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=25, partitions=1)
    batches = list(
        read_range(OffsetRange(topic_name, 0, 2, 25), props, client=client, max_records_per_batch=10)
    )
    assert [b.num_rows for b in batches] == [10, 10, 3]


def test_batches_are_made_of_several_chunks(kafka_broker, props, client, topic_name, monkeypatch):
    """Records become columns a chunk at a time (range_reader.CHUNK_RECORDS); the chunks of a
    batch are joined: every offset once, in order, batches still at most max_records_per_batch."""
    from airflow_kafka_backpressure.spark import range_reader

    monkeypatch.setattr(range_reader, "CHUNK_RECORDS", 3)
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=1)
    done: list = []
    batches = list(
        read_range(
            OffsetRange(topic_name, 0, 1, 30),
            props,
            client=client,
            max_records_per_batch=7,
            on_complete=lambda *a: done.append(a[1:]),
        )
    )
    assert [b.num_rows for b in batches] == [7, 7, 7, 7, 1]
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(1, 30))
    assert ids(table) == list(range(1, 30))
    key_value_bytes = sum(
        len(k or b"") + len(v) for k, v in zip(table["key"].to_pylist(), table["value"].to_pylist())
    )
    assert done == [(29, key_value_bytes)]


def test_offset_gaps_from_transaction_markers_end_the_read_at_until(kafka_broker, props, client, topic_name):
    """A committed transaction ends with a marker that takes an offset but is no record: ranges
    ending at, starting at or made only of markers must complete, not stall."""
    from confluent_kafka import Producer

    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(30)
    for i in range(3):
        producer.begin_transaction()
        producer.produce(topic_name, key=b"k%d" % i, value=b"v%d" % i, partition=0)
        producer.commit_transaction(30)
    assert producer.flush(30) == 0
    # records at 0, 2, 4; commit markers at 1, 3, 5
    cases = {(0, 6): [0, 2, 4], (1, 4): [2], (1, 2): [], (5, 6): [], (0, 5): [0, 2, 4]}
    for (a, b), offsets in cases.items():
        done = []
        table = read_table(
            OffsetRange(topic_name, 0, a, b),
            props,
            client,
            stall_timeout_s=10,
            on_complete=lambda *x, done=done: done.append(x),
        )
        assert table.column("offset").to_pylist() == offsets, (a, b)
        assert [(n, nbytes) for _, n, nbytes in done] == [(len(offsets), 4 * len(offsets))]


def test_values_and_schema_are_spark_kafka_sources_and_the_same_for_both_clients(
    kafka_broker, props, topic_name
):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce_sample_records(kafka_broker.bootstrap, topic_name)

    r = OffsetRange(topic_name, 0, 0, 3)
    tables = {c: read_table(r, props, c) for c in CLIENTS}
    assert tables["confluent"].equals(tables["kafka-python"])
    rows = tables["confluent"].to_pylist()
    assert [row["offset"] for row in rows] == [0, 1, 2]  # offset 3 is past until
    assert [row["key"] for row in rows] == [b"k0", None, b"k2"]
    assert [row["value"] for row in rows] == [b"v0", b"v1", None]
    assert [int(row["timestamp"].timestamp() * 1000) for row in rows] == SAMPLE_TIMESTAMPS_MS
    assert [row["timestampType"] for row in rows] == [0, 0, 0]  # create time
    assert rows[0]["headers"] is None
    assert rows[1]["headers"] == [{"key": "h", "value": b"x"}, {"key": "e", "value": b""}]


def test_range_past_the_end_stalls_with_the_partition_and_offsets_named(
    kafka_broker, props, client, topic_name
):
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=10, partitions=2)  # 5 per partition
    done = []
    with pytest.raises(KafkaRangeReadError) as err:
        list(
            read_range(
                OffsetRange(topic_name, 1, 3, 9),
                props,
                client=client,
                poll_timeout_ms=200,
                stall_timeout_s=1,
                on_complete=lambda *x, done=done: done.append(x),
            )
        )
    msg = str(err.value)
    assert f"reading {topic_name}-1[3, 9) stalled ({client})" in msg and "position 5" in msg
    assert "ends past the latest offset 5" in msg and "re-plan" in msg
    assert done == []  # a failed read is never reported complete


def test_missing_topic_and_partition_are_named_and_nothing_is_created(
    kafka_broker, props, client, topic_name
):
    with pytest.raises(KafkaRangeReadError, match=f"topic '{topic_name}' does not exist"):
        list(
            read_range(
                OffsetRange(topic_name, 0, 0, 3), props, client=client, poll_timeout_ms=200, stall_timeout_s=1
            )
        )
    assert topic_name not in topics(kafka_broker.bootstrap)

    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    with pytest.raises(
        KafkaRangeReadError, match=rf"topic '{topic_name}' has no partition 7 \(it has \[0, 1\]\)"
    ):
        list(
            read_range(
                OffsetRange(topic_name, 7, 0, 3), props, client=client, poll_timeout_ms=200, stall_timeout_s=1
            )
        )


def test_unreachable_broker_is_a_clear_error(client):
    port = free_port()  # nothing listens there
    props = {"bootstrap.servers": f"127.0.0.1:{port}", "socket.connection.setup.timeout.ms": 1000}
    with pytest.raises(KafkaRangeReadError) as err:
        list(
            read_range(
                OffsetRange("t", 0, 0, 3), props, client=client, poll_timeout_ms=200, stall_timeout_s=2
            )
        )
    msg = str(err.value)
    assert "t-0[0, 3)" in msg and f"127.0.0.1:{port}" in msg
    assert "bootstrap.servers" in msg and "security" in msg


def test_refused_login_is_a_clear_error(kafka_broker, client, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    props = {
        "bootstrap.servers": kafka_broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "nobody",
        "sasl.password": "wrong",
        "socket.connection.setup.timeout.ms": 2000,
    }
    with pytest.raises(KafkaRangeReadError) as err:
        list(read_range(OffsetRange(topic_name, 0, 0, 3), props, client=client, stall_timeout_s=10))
    msg = str(err.value)
    assert f"{topic_name}-0[0, 3)" in msg and kafka_broker.bootstrap in msg
    assert "security.protocol" in msg and "sasl.*" in msg


def test_reading_commits_nothing(kafka_broker, props, topic_name):
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=5, partitions=1)
    for c in CLIENTS:
        assert read_table(OffsetRange(topic_name, 0, 0, 5), props, c).num_rows == 5
    # control: a commit to another group is visible the same way
    group = f"control-{topic_name}"
    control = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False
    )
    tp = TopicPartition(topic_name, 0)
    control.assign([tp])
    control.commit({tp: OffsetAndMetadata(3, "", -1)})
    control.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert admin.list_group_offsets(group)[group][tp].offset == 3
        assert tp not in admin.list_group_offsets(READER_GROUP_ID).get(READER_GROUP_ID, {})
    finally:
        admin.close()


def test_on_complete_reports_once_and_only_after_a_full_read(kafka_broker, props, client, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=12, partitions=1)
    r = OffsetRange(topic_name, 0, 2, 11)
    calls = []
    batches = list(
        read_range(r, props, client=client, max_records_per_batch=4, on_complete=lambda *x: calls.append(x))
    )
    table = pa.Table.from_batches(batches)
    expected_bytes = sum(
        len(k) + len(v) for k, v in zip(table.column("key").to_pylist(), table.column("value").to_pylist())
    )
    assert calls == [(r, 9, expected_bytes)]

    calls.clear()
    it = read_range(r, props, client=client, max_records_per_batch=4, on_complete=lambda *x: calls.append(x))
    assert next(it).num_rows == 4
    it.close()  # the caller stops early: not complete
    assert calls == []

    empty = OffsetRange(topic_name, 0, 5, 5)
    assert list(read_range(empty, props, client=client, on_complete=lambda *x: calls.append(x))) == []
    assert calls == [(empty, 0, 0)]
