"""Arrow record batches with exactly the schema of Spark's Kafka source (``includeHeaders=true``).

The range reader builds one batch per chunk of consumed records, column by column: the clients
hand over plain Python lists (keys, values, offsets, timestamps …) and everything else — timestamp
units, the topic and partition columns, null headers — is done by Arrow, not per record.

Pure pyarrow: no Spark or Kafka imports, so the reader works in a plain Python process too.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

# What Spark's Python Data Source runner expects for the Kafka source schema (list element named
# "element", timestamps in microseconds, UTC, every field nullable); a unit test checks it against
# pyspark's own conversion of ``KAFKA_SCHEMA``.
HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
KAFKA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

# Spark's value for a record without a timestamp: Kafka's NO_TIMESTAMP (-1 ms), type id -1.
NO_TIMESTAMP_MS = -1
NO_TIMESTAMP_TYPE = -1


def headers_array(headers: Sequence[Sequence[tuple[str, bytes | None]] | None]) -> pa.Array:
    """One list of ``(key, value)`` headers per record (``None`` or empty: no headers) → Arrow.

    As in Spark's Kafka source, a record without headers has a null ``headers`` value. Without any
    headers in the chunk this is a single all-null array; otherwise the keys and values are
    gathered into two flat lists and the list structure is given by offsets.
    """
    n = len(headers)
    if not any(headers):
        return pa.nulls(n, HEADERS_TYPE)
    offsets = [0] * (n + 1)
    missing = [False] * n
    keys: list[str] = []
    values: list[bytes | None] = []
    end = 0
    for i, hs in enumerate(headers):
        if hs:
            for k, v in hs:
                keys.append(k)
                values.append(v)
            end += len(hs)
        else:
            missing[i] = True
        offsets[i + 1] = end
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_TYPE)
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), entries, type=HEADERS_TYPE, mask=pa.array(missing, pa.bool_())
    )


def _int_column(values: Sequence[int | None] | pa.Array, type_: pa.DataType, missing: int) -> pa.Array:
    arr = values if isinstance(values, pa.Array) else pa.array(values, pa.int64())
    if arr.null_count:
        arr = pc.fill_null(arr, missing)
    return arr.cast(type_) if arr.type != type_ else arr


def kafka_record_batch(
    topic: str,
    partition: int,
    *,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    offsets: Sequence[int],
    timestamp_ms: Sequence[int | None] | pa.Array,
    timestamp_type: Sequence[int | None] | pa.Array,
    headers: Sequence[Sequence[tuple[str, bytes | None]] | None],
) -> pa.RecordBatch:
    """The records of one topic-partition as a batch of :data:`KAFKA_ARROW_SCHEMA`.

    ``timestamp_ms`` are Kafka timestamps in milliseconds and ``timestamp_type`` Kafka's type ids
    as Spark reports them (0 create time, 1 log-append time); ``None`` stands for "none" in both
    (-1 ms and type -1, as Spark shows a record without a timestamp).
    """
    n = len(offsets)
    ms = _int_column(timestamp_ms, pa.int64(), NO_TIMESTAMP_MS)
    s = KAFKA_ARROW_SCHEMA
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pc.multiply(ms, 1000).cast(TIMESTAMP_TYPE),
            _int_column(timestamp_type, pa.int32(), NO_TIMESTAMP_TYPE),
            headers_array(headers),
        ],
        schema=s,
    )


def key_value_bytes(batch: pa.RecordBatch) -> int:
    """Key + value bytes of ``batch`` (null keys and values count 0), as the job's metrics count."""
    total = 0
    for name in ("key", "value"):
        size = pc.sum(pc.binary_length(batch.column(name))).as_py()
        total += int(size or 0)
    return total
