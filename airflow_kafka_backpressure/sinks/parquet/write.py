"""The idempotent sink: one Parquet directory per batch, written by Spark's own Parquet writer into a
staging directory and swapped in whole by a driver-side commit.

:func:`write_batch` works the same in a classic session (spark-submit) and over Spark Connect, in
three Spark jobs:

1. *fence* — an empty write to the ``kbp_batch_sink`` Python Data Source, whose writer (created on
   the driver side) raises the batch's fence to this attempt (:mod:`.fencing`); skipped for writes
   without an attempt number;
2. *data* — ``df.write.parquet(<staging>)``: Spark's native Parquet writer and its output committer
   (only the files of successful task attempts reach the staging directory), with no Python on the
   row path; or, with ``writer: "arrow"``, the reading tasks write their files themselves
   (:mod:`~airflow_kafka_backpressure.spark.arrow_writer`: whole files renamed into place, the same commit);
3. *commit* — an empty write to ``kbp_batch_sink`` whose ``commit`` (which Spark runs on the driver
   side) publishes the staging directory as the batch. If the data job fails, an *abort* write
   removes the staging directory instead (a crash leaves it: a hidden leftover the next commit of the
   batch removes).

The Data Source carries no rows: the Python code that must run where the sink is visible (the
driver side of the cluster, not a Connect client) runs in its writer's constructor and ``commit``.
In a classic session (the submit engine) the calling process *is* the driver: steps 1 and 3 then
run in it directly, without a Spark job, and the manifest is read back directly too.
Files go through :mod:`airflow_kafka_backpressure.storage` (pyarrow filesystems: local paths,

The driver-side commit, the batch directory's layout and the manifest: :mod:`.commit`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from airflow_kafka_backpressure.batch.models import OffsetRange, batch_path
from airflow_kafka_backpressure.sinks import data_sources
from airflow_kafka_backpressure.sinks.base import SetAside
from airflow_kafka_backpressure.sinks.completion import observe_reads, observe_rows
from airflow_kafka_backpressure.sinks.parquet.commit import (
    SinkError,
    commit_batch,
    errors_uri,
    staging_dir_name,
    staging_uri,
)
from airflow_kafka_backpressure.sinks.parquet.executors import executors_that_ran
from airflow_kafka_backpressure.sinks.parquet.fencing import raise_fence
from airflow_kafka_backpressure.sinks.parquet.manifest import (
    BatchManifestDataSource,
    committed_manifest,
    read_manifest,
)
from airflow_kafka_backpressure.storage import Location, StorageError, location

SINK_SOURCE_NAME = "kbp_batch_sink"


# --------------------------------------------------------------------------- writer


STAGES = ("fence", "commit", "abort")


def sink_options(
    sink: str,
    batch_id: int,
    token: str,
    ranges: Sequence[OffsetRange],
    describe: dict[str, Any],
    *,
    compression: str | None = None,
    attempt: int | None = None,
) -> dict[str, str]:
    """The writer's options for one attempt (``token``; ``attempt``: the ledger's attempt number,
    which fences the commit) at batch ``batch_id``; :func:`write_batch` adds the ``stage``."""
    opts = {
        "sink": sink,
        "batchId": str(int(batch_id)),
        "token": token,
        "ranges": json.dumps([r.to_dict() for r in ranges]),
        "describe": json.dumps(describe, sort_keys=True),
    }
    if compression:
        opts["compression"] = compression
    if attempt is not None:
        opts["attempt"] = str(int(attempt))
    return opts


class BatchSinkWriter(DataSourceArrowWriter):
    """The driver-side steps of a batch write (module doc): ``stage=fence`` raises the fence when the
    writer is created, ``stage=commit`` publishes the staging directory in ``commit``,
    ``stage=abort`` removes it. It takes no rows: Spark's Parquet writer writes the data."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        opts = {str(k).lower(): v for k, v in options.items()}
        try:
            self.sink = opts["sink"]
            self.batch_id = int(opts["batchid"])
            self.token = opts["token"]
            self.ranges = [OffsetRange.from_dict(d) for d in json.loads(opts["ranges"])]
            self.describe = json.loads(opts.get("describe", "{}"))
            self.reads = [
                (OffsetRange.from_dict(d["range"]), int(d["records"]), int(d["bytes"]))
                for d in json.loads(opts.get("reads", "[]"))
            ]
            self.read_by = [str(e) for e in json.loads(opts.get("executors", "[]"))]
            self.written_rows = int(opts["writtenrows"]) if opts.get("writtenrows") else None
            self.error_rows = int(opts["errorrows"]) if opts.get("errorrows") else None
        except (KeyError, ValueError, TypeError) as e:
            raise SinkError(
                f"{SINK_SOURCE_NAME}: options sink, batchId, token and ranges are required ({e})"
            ) from e
        self.stage = opts.get("stage", "")
        if self.stage not in STAGES:
            raise SinkError(
                f"{SINK_SOURCE_NAME}: option stage={self.stage!r} must be one of {', '.join(STAGES)}; write a "
                "batch with airflow_kafka_backpressure.sinks.parquet.write.write_batch(spark, df, sink, batch_id, ...)"
            )
        self.compression = opts.get("compression", "snappy")
        self.attempt = int(opts["attempt"]) if opts.get("attempt") else None
        self.schema = schema
        if self.stage == "fence" and self.attempt is not None:  # the driver side: "attempt n is writing"
            try:
                problem = raise_fence(location(self.sink), self.batch_id, self.attempt, self.token)
            except StorageError as e:
                raise SinkError(
                    f"batch {self.batch_id}: cannot write the fence in sink {self.sink!r}: {e}"
                ) from e
            if problem:
                raise SinkError(problem)

    def _staging(self) -> Location:
        return location(self.sink).child(staging_dir_name(self.batch_id, self.token))

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for batch in iterator:
            if batch.num_rows:
                raise SinkError(
                    f"{SINK_SOURCE_NAME} takes no rows (stage {self.stage}): a batch's data is written by "
                    "Spark's Parquet writer; use write_batch(spark, df, sink, batch_id, ...)"
                )
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.stage == "commit":
            commit_batch(
                self.sink,
                self.batch_id,
                self.token,
                self.ranges,
                self.describe,
                self.schema,
                self.compression,
                attempt=self.attempt,
                reads=self.reads,
                read_by=self.read_by,
                written_rows=self.written_rows,
                error_rows=self.error_rows,
            )
        elif self.stage == "abort":
            try:
                self._staging().delete()
            except StorageError:
                pass  # a leftover is hidden and removed by the next attempt's commit


class BatchSinkDataSource(DataSource):
    """``df.write.format("kbp_batch_sink")``: one batch of the idempotent Parquet sink."""

    @classmethod
    def name(cls) -> str:
        return SINK_SOURCE_NAME

    def writer(self, schema: StructType, overwrite: bool) -> BatchSinkWriter:
        return BatchSinkWriter(dict(self.options), schema)


# --------------------------------------------------------------------------- from a session


def register(spark: Any) -> None:
    """Register the sink's writer and manifest reader with ``spark`` (classic or Connect)."""
    data_sources.register(spark, BatchSinkDataSource, BatchManifestDataSource)


#: Columns of the Kafka schema Parquet should not try to dictionary-encode: offsets are unique in a
#: partition, and keys and values nearly always are within a batch. Parquet's writer builds a
#: dictionary for each column chunk's first pages and, for such columns, throws it away once it
#: outgrows its limit, writing the same PLAIN pages it would have written without one. Measured in
#: interleaved A/B runs (1,000 records per producer batch, local[1]; docs/benchmarks.md): the
#: Parquet write's cost over a no-op sink fell from 0.24 s to 0.10 s per 100,000 records.
#: A decoded batch's columns (``kafka_key``, ``kafka_offset``, ``kafka_value``) are the same ones.
PLAIN_COLUMNS: tuple[str, ...] = ("key", "value", "offset", "kafka_key", "kafka_offset", "kafka_value")


def plain_columns_among(
    columns: Sequence[str], plain_columns: Sequence[str] | str | None = None
) -> list[str]:
    """Which of ``columns`` are written without dictionary encoding: ``plain_columns`` (default
    :data:`PLAIN_COLUMNS`; a comma-separated string, as a pipeline file may give it)."""
    plain = PLAIN_COLUMNS if plain_columns is None else plain_columns
    if isinstance(plain, str):
        plain = [c.strip() for c in plain.split(",")]
    return sorted(set(plain) & set(columns))


def plain_column_options(
    columns: Sequence[str], plain_columns: Sequence[str] | str | None = None
) -> dict[str, str]:
    """Spark's Parquet writer options that turn dictionary encoding off for the plain columns
    (:func:`plain_columns_among`)."""
    return {f"parquet.enable.dictionary#{c}": "false" for c in plain_columns_among(columns, plain_columns)}


def write_batch(
    spark: Any,
    df: Any,
    sink: str,
    batch_id: int,
    ranges: Sequence[OffsetRange] = (),
    describe: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    compression: str | None = None,
    attempt: int | None = None,
    plain_columns: Sequence[str] | None = None,
    write_data: Callable[[str], Any] | None = None,
    count_reads: bool = False,
    set_aside: SetAside | None = None,
) -> dict[str, Any]:
    """Write ``df`` as batch ``batch_id`` of ``sink`` (replacing any previous version whole) and
    return the committed manifest, read back where Spark runs. ``token`` names the attempt (its
    staging directory, where the reader leaves its completion records); default: a fresh one.
    ``plain_columns``: the columns written without dictionary encoding (default
    :data:`PLAIN_COLUMNS`; names ``df`` lacks are ignored). ``write_data``: writes the data into
    the staging URI it is given instead of Spark's Parquet writer (``df`` then gives the schema
    only; :mod:`~airflow_kafka_backpressure.spark.arrow_writer`) and returns the rows it wrote (None: not known); the fence and
    commit are the same. The commit checks the rows it publishes against the rows written
    (:func:`commit_batch`). ``count_reads``: ``df`` is the
    batch's Kafka records as read, every range to its end (the native reader, no transform): Spark
    counts each range's records and bytes while it writes them (``DataFrame.observe``), and the
    counts travel to the commit in its options (see :func:`commit_batch`). ``set_aside``: a decoded
    batch (``df`` is its rows): settled after the data write, before the commit (its counts are the
    ranges' reads; a refusal aborts the write), and its bad records written into the staging
    directory's ``_errors/``, so swapped in with the batch (the error table,
    :data:`~.fencing.ERRORS_DIR`)."""
    opts = sink_options(
        sink,
        batch_id,
        token or uuid.uuid4().hex,
        ranges,
        describe or {},
        compression=compression,
        attempt=attempt,
    )
    token = opts["token"]
    # A classic session's driver is this process: the driver-side steps run here, directly. Over
    # Spark Connect they run on the server's driver side, in the sink Data Source's writer.
    in_driver = getattr(spark, "_jvm", None) is not None
    if not in_driver:
        register(spark)
        no_rows = df.limit(0)  # planned as an empty relation with df's schema: the stages read nothing

    def stage(name: str) -> None:
        """One driver-side step, through the same writer either way (its constructor raises the
        fence, its ``commit`` publishes or aborts)."""
        if in_driver:
            BatchSinkWriter({**opts, "stage": name}, df.schema).commit([])
        else:
            no_rows.write.format(SINK_SOURCE_NAME).mode("append").options(**opts, stage=name).save()

    if attempt is not None:
        stage("fence")
    # Timestamps as INT64 microseconds (Spark's default, INT96, is deprecated in Parquet).
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    data, observed = observe_reads(df, ranges) if count_reads and write_data is None else (df, None)
    rows: Callable[[], int] | None = None
    if write_data is None and observed is None and not (set_aside is not None and set_aside.observed):
        data, rows = observe_rows(data)  # (a decoded batch counts the rows it wrote: set_aside.good)
    read_by: set[str] | None = None
    written: Any = None
    try:
        if write_data is not None:
            written = write_data(staging_uri(sink, batch_id, token))
        else:
            writer = (
                data.write.mode("append")
                .option("compression", compression or "snappy")
                .options(**plain_column_options(df.columns, plain_columns))
            )
            if observed is not None:  # Spark's reader names no executor: the driver's status store does
                read_by = executors_that_ran(
                    spark, lambda: writer.parquet(staging_uri(sink, batch_id, token))
                )
            else:
                writer.parquet(staging_uri(sink, batch_id, token))
        if set_aside is not None:
            set_aside.settle()  # after the write when it counted the rows as they passed
            if set_aside.count:
                set_aside.errors().write.mode("append").option(
                    "compression", compression or "snappy"
                ).parquet(errors_uri(sink, batch_id, token))
    except Exception:
        try:
            stage("abort")
        except Exception:  # noqa: BLE001 - the write's own error is the one to report
            pass
        raise
    if set_aside is not None:
        opts["reads"] = json.dumps(
            [{"range": r.to_dict(), "records": n, "bytes": b} for r, n, b in set_aside.reads]
        )
        opts["errorRows"] = str(int(set_aside.count))
        if set_aside.observed:  # the rows written are the good ones, counted as they passed
            opts["writtenRows"] = str(int(set_aside.good))
    if observed is not None:
        opts["reads"] = json.dumps(
            [{"range": r.to_dict(), "records": n, "bytes": b} for r, n, b in observed()]
        )
        opts["executors"] = json.dumps(sorted(read_by or ()))
        # the native reader without a transform: every row written is a record read
        opts["writtenRows"] = str(sum(n for _, n, _ in observed()))
    elif rows is not None:
        opts["writtenRows"] = str(rows())
    elif isinstance(written, int) and not isinstance(written, bool):
        opts["writtenRows"] = str(written)
    stage("commit")
    manifest = read_manifest(sink, batch_id) if in_driver else committed_manifest(spark, sink, batch_id)
    if manifest is None or manifest.get("token") != token:
        raise SinkError(
            f"batch {batch_id}: the write finished but {batch_path(sink, batch_id)} does not hold it (another "
            "attempt at the same batch committed after it?); run the batch again"
        )
    return manifest
