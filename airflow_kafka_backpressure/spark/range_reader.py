"""Read one exact Kafka offset range ``[from, until)`` into Arrow batches — in Spark or in plain Python.

:func:`read_range` is what each input partition of the :mod:`.kafka_range_source` Data Source
runs; it needs no Spark (the bench and tests call it directly). Semantics, the same with both
clients (:mod:`.range_clients`):

* assign the partition, seek to ``from`` and read until the consumer's *position* reaches
  ``until``. Records are not counted against the range size: on real Kafka, compaction and
  transaction markers leave offset gaps, and the position moves past them;
* records at or after ``until`` (and any before ``from``) are dropped;
* when the position makes no progress for ``stall_timeout_s`` the read fails with
  :class:`KafkaRangeReadError` naming the topic-partition, the offsets and what the broker says
  about the partition (a broker like the embedded one returns nothing, rather than an error, for
  offsets past the end); an unreachable broker surfaces the same way, with the client's last
  error, and a refused login or TLS handshake fails at once;
* batches hold at most ``max_records_per_batch`` rows, with :data:`KAFKA_ARROW_SCHEMA`;
* ``on_complete(range, records, key_value_bytes)`` is called exactly once, after the last batch
  was handed over and the consumer closed — never after a failure or when the caller stops
  iterating early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.batch.options import (
    DEFAULT_ARROW_BATCH_ROWS as DEFAULT_ARROW_BATCH_ROWS,
)
from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA, key_value_bytes
from airflow_kafka_backpressure.spark.range_clients import (
    CLIENTS,
    DEFAULT_CLIENT,
    Diagnosis,
    KafkaRangeReadError,
    open_fetcher,
)

__all__ = [
    "CLIENTS",
    "DEFAULT_CLIENT",
    "DEFAULT_ARROW_BATCH_ROWS",
    "DEFAULT_POLL_TIMEOUT_MS",
    "DEFAULT_STALL_TIMEOUT_S",
    "KAFKA_ARROW_SCHEMA",
    "KafkaRangeReadError",
    "OnComplete",
    "read_range",
]

DEFAULT_POLL_TIMEOUT_MS = 1000
DEFAULT_STALL_TIMEOUT_S = 60.0
# DEFAULT_ARROW_BATCH_ROWS: declared with the pipeline's reader_options
# Records taken from the client and turned into Arrow columns at a time; the columns of several
# chunks make one batch of up to max_records_per_batch rows. Each column is a pass over the
# chunk's record objects, which stay in the CPU's cache at this size: reading a 250,000-record
# range (1,000 per Kafka batch, 100-byte records) took 0.21-0.23 s in chunks of 1,000 or 2,000
# against 0.27-0.29 s in chunks of 3,000 to 10,000 (one confluent-kafka consumer alone: 0.20 s).
CHUNK_RECORDS = 2_000

OnComplete = Callable[[OffsetRange, int, int], None]


def _joined(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of ``parts`` (a copy; ``pa.concat_batches`` needs pyarrow 19, executors may have
    an older one)."""
    [batch] = pa.Table.from_batches(parts).combine_chunks().to_batches()
    return batch


def _stalled(
    r: OffsetRange, client: str, position: int, stall_timeout_s: float, diagnosis: Diagnosis
) -> KafkaRangeReadError:
    text = (
        f"reading {r} stalled ({client}): position {position} of {r.tp} made no progress for "
        f"{stall_timeout_s:g}s ({position - r.from_offset} of {r.count} offsets done). The broker: {diagnosis.text}."
    )
    if not diagnosis.explained:
        text += (
            " Either the broker is unreachable or stopped answering (check bootstrap.servers, the network "
            "and the connection's security settings), or the range ends past the partition's latest offset "
            "(the plan must cap until_offset at it), or the broker is just slow (raise stall_timeout_s)."
        )
    return KafkaRangeReadError(text)


def read_range(
    offset_range: OffsetRange,
    kafka_props: dict[str, Any],
    *,
    client: str = DEFAULT_CLIENT,
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    max_records_per_batch: int = DEFAULT_ARROW_BATCH_ROWS,
    on_complete: OnComplete | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[from, until)`` as Arrow batches (see the module's doc).

    ``kafka_props`` are librdkafka-style connection properties; ``client`` is ``auto``,
    ``confluent`` or ``kafka-python``.
    """
    if max_records_per_batch < 1:
        raise ValueError(f"max_records_per_batch must be >= 1, got {max_records_per_batch}")
    r = offset_range
    if r.count <= 0:
        if on_complete is not None:
            on_complete(r, 0, 0)
        return
    poll_timeout_s = poll_timeout_ms / 1000
    chunk = min(CHUNK_RECORDS, max_records_per_batch)
    fetcher = open_fetcher(client, r, kafka_props, source=f"reading {r}")
    records = nbytes = 0
    try:
        position = r.from_offset
        last_progress = time.monotonic()
        pending: list[Any] = []  # client records, not yet columns
        parts: list[pa.RecordBatch] = []  # columns, not yet handed over
        held = 0  # rows in parts
        while position < r.until_offset:
            # Ask for no more than the offsets left: with no gaps that is exactly what remains, so
            # a client that waits for a full chunk (confluent) does not wait past the range's end.
            want = min(
                chunk - len(pending), max_records_per_batch - held - len(pending), r.until_offset - position
            )
            pending.extend(fetcher.fetch(want, poll_timeout_s))
            now_position = fetcher.position()
            now = time.monotonic()
            if now_position is not None and now_position > position:
                position = now_position
                last_progress = now
            elif now - last_progress > stall_timeout_s:
                raise _stalled(r, fetcher.client, position, stall_timeout_s, fetcher.diagnose(r))
            done = position >= r.until_offset
            if pending and (done or len(pending) >= chunk or held + len(pending) >= max_records_per_batch):
                part = fetcher.to_batch(pending, r)
                pending = []
                if part.num_rows:
                    parts.append(part)
                    held += part.num_rows
            if parts and (done or held >= max_records_per_batch):
                batch = parts[0] if len(parts) == 1 else _joined(parts)
                parts, held = [], 0
                records += batch.num_rows
                nbytes += key_value_bytes(batch)
                yield batch
    finally:
        fetcher.close()
    if on_complete is not None:
        on_complete(r, records, nbytes)
