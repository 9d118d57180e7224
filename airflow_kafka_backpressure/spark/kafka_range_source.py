"""A PySpark Python Data Source that reads exact Kafka offset ranges with kafka-python.

Spark's own Kafka connector (``format("kafka")``) needs a jar that is often not installed; this
source needs only ``kafka-python`` and ``pyarrow`` on the executors. Usage::

    spark.dataSource.register(KafkaRangeDataSource)
    df = (spark.read.format(SOURCE_NAME)
          .options(**range_source_options(ranges, kafka_props))
          .load())

Options (all strings, as Spark passes them):

* ``ranges`` — JSON list of ``OffsetRange.to_dict()``; one Spark input partition per non-empty range.
* ``kafka.<property>`` — librdkafka-style client properties (``kafka.bootstrap.servers`` …),
  converted with :func:`..kafka_config.to_kafka_python`. One option per property, so Spark's
  key-based redaction (``password``, ``secret`` …) hides secrets in plans and logs.
* ``pollTimeoutMs`` (1000), ``stallTimeoutS`` (60), ``maxRecordsPerBatch`` (10000).

Reading a range ``[from, until)`` assigns the partition, seeks to ``from`` and polls until the
consumer's *position* reaches ``until``; records at or after ``until`` are dropped. Records are not
counted against the range size: compaction and transaction markers leave offset gaps on real Kafka.
If the position makes no progress for ``stallTimeoutS`` the read fails with an error naming the
topic-partition and offsets (a broker like the embedded one returns nothing, rather than an error,
for offsets past the end). No consumer group, no commits.

The output has the columns and types of Spark's Kafka source with ``includeHeaders=true``; every
column is nullable there, so it is here. ``read()`` yields ``pyarrow.RecordBatch`` es with exactly
Spark's Arrow schema for it (:data:`KAFKA_ARROW_SCHEMA`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_kafka_backpressure.kafka_config import to_kafka_python
from airflow_kafka_backpressure.models import OffsetRange

SOURCE_NAME = "kbp_kafka_ranges"

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
    ]
)

# What Spark's Python Data Source runner expects for KAFKA_SCHEMA (list element named "element",
# timestamps in microseconds, UTC); a unit test checks it against pyspark's own conversion.
_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
KAFKA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(pa.field("element", _HEADER))),
    ]
)

DEFAULT_POLL_TIMEOUT_MS = 1000
DEFAULT_STALL_TIMEOUT_S = 60.0
DEFAULT_MAX_RECORDS_PER_BATCH = 10_000
KAFKA_OPTION_PREFIX = "kafka."


class KafkaRangeReadError(RuntimeError):
    """A range could not be read completely."""


def range_source_options(
    ranges: Sequence[OffsetRange],
    kafka_props: dict[str, Any],
    *,
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    max_records_per_batch: int = DEFAULT_MAX_RECORDS_PER_BATCH,
) -> dict[str, str]:
    """The reader options for ``ranges`` and the librdkafka-style ``kafka_props``."""
    opts = {
        "ranges": json.dumps([r.to_dict() for r in ranges]),
        "pollTimeoutMs": str(int(poll_timeout_ms)),
        "stallTimeoutS": str(float(stall_timeout_s)),
        "maxRecordsPerBatch": str(int(max_records_per_batch)),
    }
    for key, value in kafka_props.items():
        opts[KAFKA_OPTION_PREFIX + key] = str(value)
    return opts


class RangePartition(InputPartition):
    """One offset range; Spark ships it (pickled) to the task that reads it."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range.to_dict())
        self.offset_range = offset_range


def consumer_config(kafka_props: dict[str, Any], *, source: str) -> dict[str, Any]:
    """kafka-python ``KafkaConsumer`` arguments for reading explicit ranges: no group, no commits,
    no topic auto-creation, and an error (not a silent reset) for offsets the broker no longer has."""
    cfg = to_kafka_python(kafka_props, source=source)
    cfg.setdefault("client_id", "kbp-range-reader")
    cfg.update(
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        allow_auto_create_topics=False,
    )
    return cfg


class _BatchBuilder:
    """Columns of one Arrow record batch for a single topic-partition."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.ts_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, record: Any) -> None:
        self.keys.append(record.key)
        self.values.append(record.value)
        self.offsets.append(record.offset)
        # ms -> µs; -1 (no timestamp) stays -1 ms, as in Spark's Kafka source
        ts = record.timestamp if record.timestamp is not None else -1
        self.timestamps.append(ts * 1000)
        self.ts_types.append(record.timestamp_type if record.timestamp_type is not None else -1)
        hs = record.headers
        self.headers.append([{"key": k, "value": v} for k, v in hs] if hs else None)

    def flush(self) -> pa.RecordBatch:
        n = len(self)
        s = KAFKA_ARROW_SCHEMA
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, s.field("key").type),
                pa.array(self.values, s.field("value").type),
                pa.array([self.topic] * n, s.field("topic").type),
                pa.array([self.partition] * n, s.field("partition").type),
                pa.array(self.offsets, s.field("offset").type),
                pa.array(self.timestamps, s.field("timestamp").type),
                pa.array(self.ts_types, s.field("timestampType").type),
                pa.array(self.headers, s.field("headers").type),
            ],
            schema=s,
        )
        self._reset()
        return batch


class KafkaRangeReader(DataSourceReader):
    """Partitions = the non-empty ranges; ``read`` = one bounded kafka-python read."""

    def __init__(self, options: dict[str, str]) -> None:
        opts = {str(k).lower(): v for k, v in options.items()}
        if "ranges" not in opts:
            raise ValueError(f"{SOURCE_NAME}: option 'ranges' (JSON list of offset ranges) is required")
        try:
            self.ranges = [OffsetRange.from_dict(d) for d in json.loads(opts["ranges"])]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{SOURCE_NAME}: option 'ranges' is not a JSON list of offset ranges: {e}") from e
        self.kafka_props = {
            k[len(KAFKA_OPTION_PREFIX) :]: v for k, v in opts.items() if k.startswith(KAFKA_OPTION_PREFIX)
        }
        self.poll_timeout_ms = int(opts.get("polltimeoutms", DEFAULT_POLL_TIMEOUT_MS))
        self.stall_timeout_s = float(opts.get("stalltimeouts", DEFAULT_STALL_TIMEOUT_S))
        self.max_records_per_batch = int(opts.get("maxrecordsperbatch", DEFAULT_MAX_RECORDS_PER_BATCH))
        # Fail at planning time, on the driver, for a bad client configuration.
        consumer_config(self.kafka_props, source=f"{SOURCE_NAME} options")

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in self.ranges if r.count > 0]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # With no partitions at all (every range empty) Spark still runs one read with a
            # placeholder partition: there is nothing to read.
            return iter(())
        return read_range(
            partition.offset_range,
            self.kafka_props,
            poll_timeout_ms=self.poll_timeout_ms,
            stall_timeout_s=self.stall_timeout_s,
            max_records_per_batch=self.max_records_per_batch,
        )


def read_range(
    offset_range: OffsetRange,
    kafka_props: dict[str, Any],
    *,
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    max_records_per_batch: int = DEFAULT_MAX_RECORDS_PER_BATCH,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[from, until)`` as Arrow batches of at most ``max_records_per_batch``."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTP

    r = offset_range
    if r.count <= 0:
        return
    cfg = consumer_config(kafka_props, source=f"reading {r}")
    cfg.setdefault("max_poll_records", max_records_per_batch)
    try:
        consumer = KafkaConsumer(**cfg)
    except Exception as e:
        raise KafkaRangeReadError(
            f"cannot connect to Kafka at {cfg.get('bootstrap_servers')!r} to read {r}: "
            f"{type(e).__name__}: {e}"
        ) from e
    tp = KafkaTP(r.topic, r.partition)
    builder = _BatchBuilder(r.topic, r.partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, r.from_offset)
        position = r.from_offset
        last_progress = time.monotonic()
        while position < r.until_offset:
            polled = consumer.poll(timeout_ms=poll_timeout_ms, max_records=max_records_per_batch)
            for record in polled.get(tp, ()):
                if record.offset >= r.until_offset:
                    break
                if record.offset >= r.from_offset:
                    builder.add(record)
            now_position = consumer.position(tp)
            now = time.monotonic()
            if now_position is not None and now_position > position:
                position = now_position
                last_progress = now
            elif now - last_progress > stall_timeout_s:
                raise KafkaRangeReadError(
                    f"reading {r} stalled: position {position} of {r.tp} made no progress for "
                    f"{stall_timeout_s:g}s ({position - r.from_offset} of {r.count} offsets done). "
                    f"Either the range ends past the partition's latest offset (the plan must cap "
                    f"until_offset at it) or the broker stopped answering; check the broker, or raise "
                    f"stall_timeout_s if it is just slow."
                )
            if len(builder) >= max_records_per_batch:
                yield builder.flush()
        if len(builder):
            yield builder.flush()
    finally:
        consumer.close()


class KafkaRangeDataSource(DataSource):
    """``spark.read.format("kbp_kafka_ranges")``: exact Kafka offset ranges, Spark Kafka schema."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if schema != KAFKA_SCHEMA:
            raise ValueError(
                f"{SOURCE_NAME} has a fixed schema (Spark's Kafka source with headers); do not pass "
                f".schema(...). Got {schema.simpleString()}"
            )
        return KafkaRangeReader(dict(self.options))
