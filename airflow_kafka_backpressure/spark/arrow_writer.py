"""``writer: "arrow"``: each Spark task reads its offset range and writes the Parquet file itself.

The default writer (:func:`~airflow_kafka_backpressure.sinks.parquet.write.write_batch` with a DataFrame) sends every record from the Python
reader into the JVM as Arrow, converts it to Spark rows and has Spark's Parquet writer encode them.
When the batch is the raw Kafka records (no transform) that round trip does nothing for the
output: here the Python task that read a range writes it with pyarrow's Parquet writer, in the same
process, and the records never enter the JVM. Measured with a batching producer (docs/benchmarks.md, "Batch
engines"), this is the difference between Spark's row path and none.

The Spark job is ``spark.range(k, numPartitions=k).mapInArrow(...)``, in a classic session or over
Spark Connect alike: the reader's input partitions (:func:`.range_split.split_ranges`, the
"pieces") go to ``k`` tasks, one per piece, or, when the caller knows the task slots (a classic
session: the driver's ``defaultParallelism``, at least the executor target's cores), at most one
per slot, each writing its pieces one after the other (:func:`.range_split.group_pieces`): a task
has a fixed cost, and pieces past the slots would only run in later waves. Piece ``i`` is written
as ``part-<i>-<token>.<codec>.parquet`` into the attempt's staging directory under a hidden
temporary name and renamed there; then the task leaves the reader's completion record for it: a
retried or speculative task rewrites the same file, and the sink's commit (the same as the default
writer's: fence, manifest, swap) keeps exactly the finished files. Files have the
reader's schema (:data:`.kafka_arrow.KAFKA_ARROW_SCHEMA`, the one Spark writes for the raw source)
and the sink's Parquet settings (compression, dictionary off for
:data:`~airflow_kafka_backpressure.sinks.parquet.write.PLAIN_COLUMNS`).

Runs on executors (the task) and on the driver (:func:`write_ranges`); pyarrow and the package's
reader only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks.completion import record_read_completion
from airflow_kafka_backpressure.spark.range_split import group_pieces, split_ranges
from airflow_kafka_backpressure.spark.session_secrets import with_session_secrets
from airflow_kafka_backpressure.storage import StorageError, location

#: Spark's names of Parquet codecs -> pyarrow's (the ones both write).
_CODECS = {
    "none": "NONE",
    "uncompressed": "NONE",
    "snappy": "SNAPPY",
    "gzip": "GZIP",
    "zstd": "ZSTD",
    "lz4": "LZ4",
    "brotli": "BROTLI",
}
#: Records are buffered up to this many bytes per Parquet row group (the reader's Arrow batches are
#: small; one row group each would make files slow to scan). Spark's writer aims at 128 MiB
#: (``parquet.block.size``) of *encoded* data; this bounds the task's memory instead.
ROW_GROUP_BYTES = 64 * 1024 * 1024
_RESULT_SCHEMA = pa.schema([pa.field("piece", pa.int64()), pa.field("rows", pa.int64())])


def parquet_codec(compression: str | None) -> str:
    """pyarrow's name of the Parquet codec Spark calls ``compression`` (default snappy)."""
    name = (compression or "snappy").lower()
    if name not in _CODECS:
        raise ValueError(
            f"parquet_compression = {compression!r} is not available with writer 'arrow': use one of "
            f"{', '.join(sorted(_CODECS))}, or writer 'spark'"
        )
    return _CODECS[name]


def dictionary_columns(columns: Sequence[str], plain_columns: Sequence[str] | str | None) -> list[str]:
    """The columns Parquet may dictionary-encode: all but the sink's plain ones."""
    from airflow_kafka_backpressure.sinks.parquet.write import plain_columns_among  # defers pyspark

    plain = set(plain_columns_among(columns, plain_columns))
    return [c for c in columns if c not in plain]


class RangeFileTask:
    """The ``mapInArrow`` function: the ids of its input rows are indexes into ``groups`` (default:
    one group per piece); for each piece of the group, read the piece and write its file (see the
    module doc). A module-level class, so Spark pickles it by reference and executors import this
    module (shipped with the package)."""

    def __init__(
        self,
        pieces: Sequence[OffsetRange],
        kafka_props: dict[str, Any],
        read_options: dict[str, Any],
        staging: str,
        records_dir: str,
        token: str,
        compression: str | None,
        plain_columns: Sequence[str] | str | None,
        groups: Sequence[Sequence[int]] | None = None,
        secrets_file: str | None = None,
    ) -> None:
        self.pieces = [p.to_dict() for p in pieces]

        self.groups = [list(g) for g in (groups if groups is not None else group_pieces(pieces, None))]
        self.kafka_props = dict(kafka_props)
        self.read_options = dict(read_options)
        self.staging = staging
        self.records_dir = records_dir
        self.token = token
        self.codec = parquet_codec(compression)
        self.plain_columns = plain_columns
        self.secrets_file = secrets_file  # the session's file with the secret Kafka properties

    def file_name(self, index: int) -> str:
        return f"part-{index:05d}-{self.token}.{self.codec.lower()}.parquet"

    def write_piece(self, index: int) -> int:
        """Read piece ``index`` into its Parquet file; returns the rows written."""
        import pyarrow.parquet as pq

        # defers pyarrow.compute and the Kafka clients: on the executors
        from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA
        from airflow_kafka_backpressure.spark.range_reader import read_range

        r = OffsetRange.from_dict(self.pieces[index])
        directory = location(self.staging)
        target = directory.child(self.file_name(index))
        tmp = directory.child(f".{target.name}.{uuid.uuid4().hex}.tmp")  # hidden: the commit drops leftovers
        done: list[tuple[int, int]] = []
        try:
            directory.mkdirs()
            with tmp.fs.open_output_stream(tmp.path) as out:
                writer = pq.ParquetWriter(
                    out,
                    KAFKA_ARROW_SCHEMA,
                    compression=self.codec,
                    use_dictionary=dictionary_columns(KAFKA_ARROW_SCHEMA.names, self.plain_columns),
                )
                pending: list[pa.RecordBatch] = []
                pending_bytes = 0
                try:
                    for batch in read_range(
                        r,
                        with_session_secrets(self.kafka_props, self.secrets_file),
                        on_complete=lambda _r, n, b: done.append((n, b)),
                        **self.read_options,
                    ):
                        pending.append(batch)
                        pending_bytes += batch.nbytes
                        if pending_bytes >= ROW_GROUP_BYTES:
                            writer.write_table(pa.Table.from_batches(pending))
                            pending, pending_bytes = [], 0
                    if pending:
                        writer.write_table(pa.Table.from_batches(pending))
                finally:
                    writer.close()
            tmp.move_to(target)
        except BaseException:
            try:
                tmp.delete()
            except StorageError:
                pass
            raise
        # read to its end and written: only now may the commit count it (every record read was written)
        [(records, nbytes)] = done
        record_read_completion(self.records_dir, r, records, nbytes)
        return records

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for group in batch.column("id").to_pylist():
                for index in self.groups[int(group)]:
                    rows = self.write_piece(index)
                    yield pa.RecordBatch.from_pydict(
                        {"piece": [index], "rows": [rows]}, schema=_RESULT_SCHEMA
                    )


def write_ranges(
    spark: Any,
    ranges: Sequence[OffsetRange],
    kafka_props: dict[str, Any],
    *,
    staging: str,
    records_dir: str,
    token: str,
    client: str,
    min_partitions: int | None,
    max_records_per_partition: int | None,
    compression: str | None = None,
    plain_columns: Sequence[str] | str | None = None,
    slots: int | None = None,
    secrets_file: str | None = None,
    **read_options: Any,
) -> int:
    """Write ``ranges`` into ``staging`` with one Spark task per input partition, or per task slot
    when ``slots`` is given and there are more pieces (module doc); returns the rows written (the
    Spark job fails, with the task's error, if any piece cannot be read or written).
    ``read_options``: :func:`.range_reader.read_range`'s (poll and stall timeouts, batch size);
    ``max_records_per_partition`` 0 or None: no limit; ``secrets_file``: the Spark Connect session's
    file with the secret Kafka properties that ``kafka_props`` lacks (:mod:`.session_secrets`)."""
    # defers the Kafka clients (confluent-kafka, kafka-python)
    from airflow_kafka_backpressure.spark.range_clients import check_reader_config

    check_reader_config(kafka_props, client, source="the batch's Kafka properties")
    pieces = split_ranges(
        ranges, min_partitions=min_partitions, max_records_per_partition=max_records_per_partition or None
    )
    if not pieces:
        return 0  # the commit writes the schema-only file of an empty batch
    groups = group_pieces(pieces, slots)
    task = RangeFileTask(
        pieces,
        kafka_props,
        {**read_options, "client": client},
        staging,
        records_dir,
        token,
        compression,
        plain_columns,
        groups,
        secrets_file,
    )
    done = spark.range(0, len(groups), 1, len(groups)).mapInArrow(task, "piece long, rows long").collect()
    if sorted(int(row["piece"]) for row in done) != list(range(len(pieces))):
        raise RuntimeError(
            f"the write job reported pieces {sorted(row['piece'] for row in done)} of {len(pieces)}"
        )
    return sum(int(row["rows"]) for row in done)
