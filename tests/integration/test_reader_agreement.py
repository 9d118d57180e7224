"""Both readers (Spark's ``format("kafka")`` and the Python Data Source) on the cases where offsets
and records part ways, on Apache Kafka:

* transaction markers (an offset each, no record) and an aborted transaction under
  ``read_committed``: the committed records only, the ranges read to their end;
* a compacted topic: offsets whose records the log cleaner removed;
* a range whose start was deleted (DeleteRecords, as retention deletes): the job refuses it before
  reading, naming the range and the earliest offset, whichever reader;
* a batch over more ranges than it counts one by one as its rows pass (Spark's reader), with
  ranges read whole and ranges that end with a transaction's marker.

Each batch runs through :func:`run_batch` in the session's local[2] Spark and is read back from the
sink with pyarrow.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.sinks.completion import PER_RANGE_AGGREGATES
from airflow_kafka_backpressure.spark.job import JobError, run_batch
from kbp_local.producer import ensure_topic

from .kafka_samples import delete_records
from .test_spark_job import make_spec

READERS = ["python", "native"]


def sink_rows(sink: Path) -> list[tuple[int, bytes, bytes]]:
    table = pads.dataset(str(sink), format="parquet", partitioning="hive").to_table()
    rows = zip(
        table.column("offset").to_pylist(), table.column("key").to_pylist(), table.column("value").to_pylist()
    )
    return sorted(rows)


def latest(bootstrap: str, topic: str) -> int:
    with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
        return k.latest_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]


def run(
    spark, tmp_path: Path, bootstrap: str, topic: str, until: int, reader: str, kafka: dict | None = None
):
    sink = tmp_path / f"sink-{reader}"
    spec = make_spec(
        tmp_path,
        bootstrap,
        1,
        {(topic, 0): (0, until)},
        sink=sink,
        kafka={"bootstrap.servers": bootstrap, **(kafka or {})},
        options={"writer": "spark"},
    )
    spec = type(spec).from_dict({**spec.to_dict(), "reader": reader})
    return run_batch(spark, spec), sink_rows(sink)


# --------------------------------------------------------------------------- transactions


@pytest.fixture(scope="module")
def transactional_topic(kafka_broker):
    """One partition: a committed transaction of 5 records (offsets 0-4, marker 5), an aborted one
    of 3 (6-8, marker 9), a committed one of 4 (10-13, marker 14). Latest offset 15."""
    from confluent_kafka import Producer

    topic = f"txn-{int(time.time() * 1000)}"
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer(
        {"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 5}
    )
    producer.init_transactions(30)
    committed = []
    for n, commit in ((5, True), (3, False), (4, True)):
        producer.begin_transaction()
        for i in range(n):
            key, value = f"k{i}".encode(), f"{topic}-{len(committed)}-{i}-{commit}".encode()
            producer.produce(topic, key=key, value=value, partition=0)
            if commit:
                committed.append((key, value))
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    assert latest(kafka_broker.bootstrap, topic) == 15
    return topic, committed


@pytest.mark.parametrize("reader", READERS)
def test_read_committed_skips_aborted_records_and_markers(
    spark, kafka_broker, transactional_topic, tmp_path, reader
):
    topic, committed = transactional_topic
    metrics, rows = run(
        spark,
        tmp_path,
        kafka_broker.bootstrap,
        topic,
        15,
        reader,
        kafka={"isolation.level": "read_committed"},
    )
    assert [(k, v) for _, k, v in rows] == committed
    assert [o for o, _, _ in rows] == [0, 1, 2, 3, 4, 10, 11, 12, 13]
    assert metrics.records == len(committed) == 9


@pytest.mark.parametrize("reader", READERS)
def test_read_uncommitted_sees_the_aborted_records_but_no_markers(
    spark, kafka_broker, transactional_topic, tmp_path, reader
):
    topic, _ = transactional_topic
    metrics, rows = run(spark, tmp_path, kafka_broker.bootstrap, topic, 15, reader)
    assert [o for o, _, _ in rows] == [0, 1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13]
    assert metrics.records == 12


# --------------------------------------------------------------------------- compaction


@pytest.fixture(scope="module")
def compacted_topic(kafka_broker):
    """A compacted partition whose first segments the log cleaner has compacted: 3 keys written 10
    times each, each round rolling a new segment; only the latest value per key survives in the
    cleaned segments. Returns (topic, latest offset, the surviving (offset, key, value)s)."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"compacted-{int(time.time() * 1000)}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    1,
                    1,
                    topic_configs={
                        "cleanup.policy": "compact",
                        "segment.ms": "100",
                        "min.cleanable.dirty.ratio": "0.01",
                        "min.compaction.lag.ms": "0",
                        "delete.retention.ms": "100",
                    },
                )
            ]
        )
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    try:
        for rnd in range(10):
            for k in range(3):
                producer.send(topic, key=f"k{k}".encode(), value=f"v{rnd}".encode(), partition=0)
            producer.flush()
            time.sleep(0.3)  # the next record rolls the segment (segment.ms)
    finally:
        producer.close()
    end = latest(kafka_broker.bootstrap, topic)
    assert end == 30
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    tp = KTP(topic, 0)
    try:
        deadline = time.monotonic() + 120
        while True:  # until the cleaner has removed records (its backoff is 15 s by default)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            seen = []
            while consumer.position(tp) < end:
                for batch in consumer.poll(timeout_ms=1000).values():
                    seen += [(r.offset, r.key, r.value) for r in batch if r.offset < end]
            if len(seen) < end:
                return topic, end, seen
            assert time.monotonic() < deadline, "the log cleaner did not compact the topic within 120 s"
            time.sleep(2)
    finally:
        consumer.close()


@pytest.mark.parametrize("reader", READERS)
def test_a_compacted_range_is_read_to_its_end_with_its_surviving_records(
    spark, kafka_broker, compacted_topic, tmp_path, reader
):
    topic, end, surviving = compacted_topic
    metrics, rows = run(spark, tmp_path, kafka_broker.bootstrap, topic, end, reader)
    assert rows == surviving
    assert metrics.records == len(surviving) < end


# --------------------------------------------------------------------------- a deleted range start


@pytest.fixture
def deleted_start(kafka_broker, topic_name) -> str:
    """A partition of 20 records whose first 5 were deleted (earliest offset 5)."""
    from kbp_local.producer import produce

    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    produce(kafka_broker.bootstrap, topic_name, count=20, partitions=1)
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic_name, 0): 5})
    return topic_name


@pytest.mark.parametrize("reader", READERS)
def test_a_range_whose_start_was_deleted_is_refused_before_reading(
    spark, kafka_broker, deleted_start, tmp_path, reader
):
    topic = deleted_start
    with pytest.raises(
        JobError,
        match=rf"{topic}-0\[0, 20\): starts below the earliest offset 5 .* offsets \[0, 5\) were deleted",
    ):
        run(spark, tmp_path, kafka_broker.bootstrap, topic, 20, reader)
    assert not (tmp_path / f"sink-{reader}" / "batch_id=1").exists()


@pytest.mark.parametrize("reader", READERS)
def test_records_deleted_after_the_check_fail_the_read(
    spark, kafka_broker, deleted_start, tmp_path, monkeypatch, reader
):
    """Retention that strikes between the bounds check and the read (the check bypassed here): the
    read fails rather than skip the deleted offsets (Spark's ``failOnDataLoss``; the Python reader's
    own check); the ledger's ``on_data_loss`` decides at the next plan or replay."""
    from airflow_kafka_backpressure.spark import job

    monkeypatch.setattr(job, "check_bounds", lambda s: {})
    with pytest.raises(JobError, match=rf"{deleted_start}-0\[0, 20\)"):
        run(spark, tmp_path, kafka_broker.bootstrap, deleted_start, 20, reader)
    assert not (tmp_path / f"sink-{reader}" / "batch_id=1").exists()


# --------------------------------------------------------------------------- many partitions

MANY = PER_RANGE_AGGREGATES + 8


@pytest.fixture(scope="module")
def many_partitions(kafka_broker):
    """A topic of more partitions than a batch counts one aggregate per range for: 3 records in
    each, written by one committed transaction (each partition's marker at offset 3, latest 4),
    so its ranges hold fewer records than offsets."""
    from confluent_kafka import Producer

    topic = f"many-{int(time.time() * 1000)}"
    ensure_topic(kafka_broker.bootstrap, topic, MANY)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(MANY):
        for i in range(3):
            producer.produce(topic, key=f"{p}-{i}".encode(), value=b"v" * (p + 1), partition=p)
    producer.commit_transaction(30)
    return topic


def test_a_batch_over_many_ranges_counts_each_range_exactly_with_markers_and_without(
    spark, kafka_broker, many_partitions, tmp_path
):
    """More ranges than :data:`PER_RANGE_AGGREGATES`: Spark's reader counts every row in one
    aggregate. Ranges [0, 3) hold a record per offset (the total equals the plan: each range
    whole); ranges [0, 4) end with the transaction's marker (the total falls short: each range
    recounted). Either way the metrics give each partition its 3 records, and the sink holds each
    record once."""
    topic = many_partitions
    for batch_id, until in ((1, 3), (2, 4)):
        sink = tmp_path / f"sink-{until}"
        spec = make_spec(
            tmp_path,
            kafka_broker.bootstrap,
            batch_id,
            {(topic, p): (0, until) for p in range(MANY)},
            sink=sink,
            kafka={"bootstrap.servers": kafka_broker.bootstrap, "isolation.level": "read_committed"},
            options={"writer": "spark"},
        )
        spec = type(spec).from_dict({**spec.to_dict(), "reader": "native"})
        metrics = run_batch(spark, spec)
        assert {(c.topic, c.partition): c.records for c in metrics.partitions} == {
            (topic, p): 3 for p in range(MANY)
        }
        assert metrics.records == 3 * MANY
        assert metrics.bytes == sum(3 * (len(f"{p}-0") + p + 1) for p in range(MANY))
        table = pads.dataset(str(sink), format="parquet", partitioning="hive").to_table()
        keys = sorted(table.column("key").to_pylist())
        assert keys == sorted(f"{p}-{i}".encode() for p in range(MANY) for i in range(3))
