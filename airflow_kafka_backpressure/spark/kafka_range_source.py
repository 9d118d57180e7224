"""A PySpark Python Data Source that reads exact Kafka offset ranges, with confluent-kafka or kafka-python.

Spark's own Kafka connector (``format("kafka")``) needs a jar that is often not installed; this
source needs only ``pyarrow`` and a Kafka client (confluent-kafka, else kafka-python) on the
executors. Usage::

    spark.dataSource.register(KafkaRangeDataSource)
    df = (spark.read.format(SOURCE_NAME)
          .options(**range_source_options(ranges, kafka_props))
          .load())

Options (all strings, as Spark passes them; names are case-insensitive):

* ``ranges`` — JSON list of ``OffsetRange.to_dict()`` (required).
* ``kafka.<property>`` — librdkafka-style client properties (``kafka.bootstrap.servers`` …), see
  :mod:`..kafka.config`. One option per property, so Spark's key-based redaction (``password``,
  ``secret`` …) hides secrets where it redacts options (a Spark Connect plan's text is not such a
  place: the connect engine passes them in ``secretsFile`` instead).
* ``client`` — ``auto`` (default: confluent-kafka where the executor can import it, else
  kafka-python), ``confluent`` or ``kafka-python``.
* ``minPartitions`` — as Spark's Kafka source: split large ranges proportionally until there are
  at least this many input partitions (default: unset).
* ``maxRecordsPerPartition`` — as Spark's Kafka source: no input partition covers more offsets
  (default :data:`DEFAULT_MAX_RECORDS_PER_PARTITION`; ``0`` = no limit). See :mod:`.range_split`.
* ``pollTimeoutMs`` (1000), ``stallTimeoutS`` (60), ``maxRecordsPerBatch`` (10000): see
  :func:`.range_reader.read_range`, which each input partition runs.
* ``secretsFile`` — optional: the Spark Connect session's file with the secret Kafka properties,
  added to the ``kafka.*`` ones where a client is made (:mod:`.session_secrets`).
* ``readRecordsDir`` — optional: a directory URI where each input partition, once read to its end,
  leaves a completion record (its range, records and key+value bytes) for the sink's commit
  (:func:`~airflow_kafka_backpressure.sinks.completion.record_read_completion`).

The output has the columns and types of Spark's Kafka source with ``includeHeaders=true``; every
column is nullable there, so it is here. ``read()`` yields ``pyarrow.RecordBatch`` es with exactly
Spark's Arrow schema for it (:data:`KAFKA_ARROW_SCHEMA`).
"""

from __future__ import annotations

import json
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

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.batch.options import (  # declared with the pipeline's reader_options
    DEFAULT_MAX_RECORDS_PER_PARTITION as DEFAULT_MAX_RECORDS_PER_PARTITION,
)
from airflow_kafka_backpressure.sinks.completion import record_read_completion
from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA
from airflow_kafka_backpressure.spark.range_clients import (
    DEFAULT_CLIENT,
    KafkaRangeReadError,
    check_reader_config,
)
from airflow_kafka_backpressure.spark.range_reader import (
    DEFAULT_ARROW_BATCH_ROWS,
    DEFAULT_POLL_TIMEOUT_MS,
    DEFAULT_STALL_TIMEOUT_S,
    read_range,
)
from airflow_kafka_backpressure.spark.range_split import split_ranges
from airflow_kafka_backpressure.spark.session_secrets import with_session_secrets

__all__ = [
    "DEFAULT_ARROW_BATCH_ROWS",
    "DEFAULT_MAX_RECORDS_PER_PARTITION",
    "KAFKA_ARROW_SCHEMA",
    "KAFKA_SCHEMA",
    "SOURCE_NAME",
    "KafkaRangeDataSource",
    "KafkaRangeReadError",
    "KafkaRangeReader",
    "range_source_options",
    "read_range",
]

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


KAFKA_OPTION_PREFIX = "kafka."


def range_source_options(
    ranges: Sequence[OffsetRange],
    kafka_props: dict[str, Any],
    *,
    client: str = DEFAULT_CLIENT,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = DEFAULT_MAX_RECORDS_PER_PARTITION,
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    max_records_per_batch: int = DEFAULT_ARROW_BATCH_ROWS,
    read_records_dir: str | None = None,
    secrets_file: str | None = None,
) -> dict[str, str]:
    """The reader options for ``ranges`` and the librdkafka-style ``kafka_props``
    (``max_records_per_partition=None``: no limit; ``secrets_file``: see :mod:`.session_secrets`)."""
    opts = {
        "ranges": json.dumps([r.to_dict() for r in ranges]),
        "client": client,
        "maxRecordsPerPartition": str(int(max_records_per_partition or 0)),
        "pollTimeoutMs": str(int(poll_timeout_ms)),
        "stallTimeoutS": str(float(stall_timeout_s)),
        "maxRecordsPerBatch": str(int(max_records_per_batch)),
    }
    if min_partitions is not None:
        opts["minPartitions"] = str(int(min_partitions))
    if read_records_dir:
        opts["readRecordsDir"] = read_records_dir
    if secrets_file:
        opts["secretsFile"] = secrets_file
    for key, value in kafka_props.items():
        opts[KAFKA_OPTION_PREFIX + key] = str(value)
    return opts


class RangePartition(InputPartition):
    """One offset range; Spark ships it (pickled) to the task that reads it."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range.to_dict())
        self.offset_range = offset_range


def _number(opts: dict[str, str], name: str, default: Any, kind: type, minimum: float) -> Any:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"{SOURCE_NAME}: option {name!r} must be a {kind.__name__} >= {minimum:g}, got {raw!r}"
        )
    return value


class KafkaRangeReader(DataSourceReader):
    """Partitions = the non-empty ranges, split as Spark's Kafka source would; ``read`` = one
    bounded read per partition (:func:`.range_reader.read_range`)."""

    def __init__(self, options: dict[str, str]) -> None:
        opts = {str(k).lower(): v for k, v in options.items()}
        if "ranges" not in opts:
            raise ValueError(f"{SOURCE_NAME}: option 'ranges' (JSON list of offset ranges) is required")
        try:
            self.ranges = [OffsetRange.from_dict(d) for d in json.loads(opts["ranges"])]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{SOURCE_NAME}: option 'ranges' is not a JSON list of offset ranges: {e}"
            ) from e
        self.kafka_props = {
            k[len(KAFKA_OPTION_PREFIX) :]: v for k, v in opts.items() if k.startswith(KAFKA_OPTION_PREFIX)
        }
        self.client = opts.get("client", DEFAULT_CLIENT)
        self.min_partitions = _number(opts, "minPartitions", None, int, 1)
        self.max_records_per_partition = (
            _number(opts, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION, int, 0) or None
        )
        self.poll_timeout_ms = _number(opts, "pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, int, 1)
        self.stall_timeout_s = _number(opts, "stallTimeoutS", DEFAULT_STALL_TIMEOUT_S, float, 0)
        self.max_records_per_batch = _number(opts, "maxRecordsPerBatch", DEFAULT_ARROW_BATCH_ROWS, int, 1)
        self.read_records_dir = opts.get("readrecordsdir") or None
        self.secrets_file = opts.get("secretsfile") or None
        # Fail at planning time, on the driver, for a bad client choice or configuration.
        check_reader_config(self.kafka_props, self.client, source=f"{SOURCE_NAME} options")

    def partitions(self) -> Sequence[InputPartition]:
        pieces = split_ranges(
            self.ranges,
            min_partitions=self.min_partitions,
            max_records_per_partition=self.max_records_per_partition,
        )
        return [RangePartition(r) for r in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # With no partitions at all (every range empty) Spark still runs one read with a
            # placeholder partition: there is nothing to read.
            return iter(())
        on_complete = None
        if self.read_records_dir is not None:
            directory = self.read_records_dir

            def on_complete(r: OffsetRange, records: int, nbytes: int) -> None:
                record_read_completion(directory, r, records, nbytes)

        return read_range(
            partition.offset_range,
            with_session_secrets(self.kafka_props, self.secrets_file),
            client=self.client,
            poll_timeout_ms=self.poll_timeout_ms,
            stall_timeout_s=self.stall_timeout_s,
            max_records_per_batch=self.max_records_per_batch,
            on_complete=on_complete,
        )


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
