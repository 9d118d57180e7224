"""Delta Lake sink: each batch is one Delta transaction, idempotent by (pipeline, batch id, attempt).

How a batch is written (:meth:`DeltaSink.write_batch`), as one ``df.write.format("delta")``:

* the rows get two columns, ``kbp_pipeline`` and ``kbp_batch_id`` (first, so that a new table
  keeps column statistics for them: Delta collects them for the first 32 columns by default);
* the batch's first attempt (attempt 1) appends: no attempt of the batch can have written
  before it, and a retry of it is skipped by Delta (below). Every later attempt writes with mode
  ``overwrite`` and ``replaceWhere = kbp_pipeline = <p> AND kbp_batch_id = <N>L``: the transaction
  removes whatever rows the batch had and adds the new ones, atomically, and touches no other batch
  or pipeline (Delta checks every written row matches the predicate). A rewrite replaces the batch;
  it never appends beside it. Delta finds the rows to replace with a ``DELETE`` inside the
  transaction that skips files by their column statistics, so it reads only the files that may
  hold the batch's rows (those the batch's last commit added, or a file an ``OPTIMIZE`` merged them
  into), as long as the predicate's literal is of the column's type: with ``<N>`` (an INT against
  the BIGINT column) Delta's analysed-only predicate keeps a cast that file skipping cannot use, and
  read every data file (a rewrite at 10,000 batches: 1,250 tasks over 40,000 files). A first attempt
  still appends, which needs no file skipping at all;
* Delta's idempotent-write options ``txnAppId = kbp:<pipeline>:batch:<N>`` (one application id per
  batch) and ``txnVersion = <attempt>`` (the ledger's attempt number). Delta skips a write whose
  txnVersion is <= the last one committed for that app id, checked inside the transaction. With one
  app id per batch: a retry of the same attempt is skipped (no duplicate), a newer attempt lands, an
  older (zombie) attempt is skipped — fencing for free — and a replay of batch 5 after batches 6
  and 7 lands, since batch 5's app id knows nothing of 6 and 7. (A single app id for the whole
  pipeline with txnVersion = batch id would silently drop that replay.);
* ``userMetadata`` = the batch's JSON (pipeline, batch id, attempt, ranges, expected records),
  stored in the commit's ``commitInfo``: :meth:`DeltaSink.committed` reads it back from the
  table's history (``DESCRIBE HISTORY``) with Delta's own count of the batch's rows the commit added
  (``operationMetrics``: ``numOutputRows`` less ``numCopiedRows``, the rows of other batches a
  ``replaceWhere`` copied out of a file it rewrote, as it must after an ``OPTIMIZE`` put several
  batches in one file).

Delta's skip is silent, so after the write the sink reads the batch's newest commit back
(:meth:`DeltaSink.committed`: among the table's last :attr:`DeltaSink.recent_commits` commits, where
it is unless other writers committed many times meanwhile or Delta skipped the write; further back
only if the table holds rows of the batch, never the whole history for nothing): written by
this attempt (now or by an earlier try of it) is success; by a newer attempt raises
:class:`~.base.SinkFenced`; a row count other than ``expected_records`` raises
:class:`~.base.SinkFormatError` (the commit stays until a newer attempt replaces it). Delta checks
the app id's version when the write starts; a zombie attempt whose write started before a newer
attempt committed is refused at its own commit instead, by Delta's conflict check (the winner
committed a ``txn`` of the app id whose version this transaction read): that refusal, when a newer attempt
of the batch has committed, raises :class:`~.base.SinkFenced` too.

**A batch id the table has seen with other offsets** (the ledger was reset or restored from an older
backup, so its batch ids repeat) is refused with :class:`~.base.SinkFormatError` naming the committed
and the planned ranges, as the Parquet sink's :func:`~.parquet.commit.check_replaceable` does: a rewrite
(attempt 2 or later) compares them before it writes, so its ``replaceWhere`` never deletes the other
batch's rows; a first attempt, which Delta skips as already done (the app id's version is at least 1),
compares them in the read-back, so it is not recorded as done with its records never written. The
same ranges, or the same partitions and ends where one starts later (a replay that retention or a
topic reset trimmed), are the same batch (:func:`~.base.same_batch_offsets`).

Needs the Delta jars and SQL extension on the session (``local.jars.spark_delta_conf``); works on
any path Spark's writer takes: a local path, ``s3a://`` with hadoop-aws. Concurrent writers: on a
local or HDFS path Delta's commit (an atomic create of ``_delta_log/<v>.json``) is safe among any
number of writers; on S3 the default LogStore (``S3SingleDriverLogStore``) is safe for one driver
at a time only: two drivers committing the same table version at once can overwrite each other's
log entry (see docs/sinks.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from airflow_kafka_backpressure.batch.models import OffsetRange

from .base import SinkFenced, SinkFormatError
from .table import (
    BATCH_COLUMN,
    PIPELINE_COLUMN,
    BatchCommit,
    PartitionBy,
    TableFormat,
    batch_metadata,
    fenced_message,
    marked_rows,
    other_batch_message,
    same_batch_offsets,
)

log = logging.getLogger(__name__)


def app_id(pipeline: str, batch_id: int) -> str:
    """Delta's ``txnAppId`` of one batch: its own transaction id space, so its attempts are ordered
    among themselves only."""
    return f"kbp:{pipeline}:batch:{batch_id}"


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def batch_predicate(pipeline: str, batch_id: int) -> str:
    """The ``replaceWhere`` predicate that selects exactly the batch's rows. The batch id is a
    BIGINT literal (``5L``), of the column's type: an INT literal gets a cast, which Delta's
    ``replaceWhere`` (its predicate is analysed, never optimised) cannot use to skip files by their
    statistics, so it would read every data file of the table."""
    return f"{PIPELINE_COLUMN} = {_sql_string(pipeline)} AND {BATCH_COLUMN} = {int(batch_id)}L"


def _table_ref(sink: str) -> str:
    return "delta.`" + sink.replace("`", "``") + "`"


def _is_missing_table(error: Exception) -> bool:
    text = str(error)
    return any(
        marker in text
        for marker in (
            "DELTA_MISSING_DELTA_TABLE",
            "is not a Delta table",
            "PATH_NOT_FOUND",
            "DELTA_TABLE_NOT_FOUND",
        )
    )


#: Delta's refusals of a transaction because another one committed since it read the table: the
#: error classes of ``io.delta.exceptions``' ``DeltaConcurrentModificationException`` subclasses
#: (a concurrent append, delete or transaction of the same app id; the table created, or its
#: metadata or protocol changed, meanwhile).
_CONCURRENT_ERRORS = (
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
    "io.delta.exceptions.",
    "DeltaConcurrentModificationException",
)


def _is_concurrent_commit(error: Exception) -> bool:
    """Delta refused the transaction because another one committed since it read the table
    (:data:`_CONCURRENT_ERRORS`), in classic PySpark (py4j's text of the JVM exception) and over
    Spark Connect (the error class in the message)."""
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _CONCURRENT_ERRORS)


#: Delta's LogStores that make a table's commits exclusive only within one driver's memory: two
#: drivers can write the same ``_delta_log/<version>.json`` (S3 had no conditional PUT; hadoop-aws
#: 3.5.0 sends none), and the later one overwrites the earlier commit
SINGLE_DRIVER_LOG_STORES = frozenset(
    {"io.delta.storage.S3SingleDriverLogStore", "org.apache.spark.sql.delta.storage.S3SingleDriverLogStore"}
)
#: Delta's default LogStore per path scheme (its ``DelegatingLogStore``); other schemes get
#: ``HDFSLogStore``, whose create-if-absent is atomic
DEFAULT_LOG_STORES = {
    **dict.fromkeys(("s3", "s3a", "s3n"), "io.delta.storage.S3SingleDriverLogStore"),
    **dict.fromkeys(("abfs", "abfss", "adl", "wasb", "wasbs"), "io.delta.storage.AzureLogStore"),
    "gs": "io.delta.storage.GCSLogStore",
}


def log_store_class(sink: str, spark_conf: Mapping[str, str]) -> str:
    """The LogStore class Delta commits ``sink`` with, by Delta's rules: ``spark.delta.logStore.class``
    (or ``delta.logStore.class``) for every path, else ``spark.delta.logStore.<scheme>.impl`` (or
    without ``spark.``), else its default for the path's scheme."""
    for key in ("spark.delta.logStore.class", "delta.logStore.class"):
        if spark_conf.get(key):
            return str(spark_conf[key])
    scheme = urlsplit(sink).scheme.lower()
    scheme = scheme if len(scheme) > 1 else "file"  # a local path (or a Windows drive letter)
    for key in (f"spark.delta.logStore.{scheme}.impl", f"delta.logStore.{scheme}.impl"):
        if spark_conf.get(key):
            return str(spark_conf[key])
    return DEFAULT_LOG_STORES.get(scheme, "io.delta.storage.HDFSLogStore")


def _other_batch(
    where: str, attempt: int, commit: BatchCommit, planned: Sequence[OffsetRange], done: str
) -> str:
    return other_batch_message(where, attempt, commit, planned, done, f"table version {commit.version}")


def _partitioning_changed(where: str, partition_by: PartitionBy | None, error: Exception) -> str:
    given = "none" if partition_by is None else f"{partition_by.transform}({partition_by.column})"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"{where}: the table's partitioning is not the pipeline's sink_options.partition_by ({given}): a "
        "Delta table's partition columns are fixed when it is created. Nothing was written. Set partition_by "
        f"back to what the table has, or point the pipeline at a new table (its sink). Delta said: {first}"
    )


def _fenced(where: str, attempt: int, newer: BatchCommit) -> str:
    return fenced_message(where, attempt, newer, f"table version {newer.version}")


class DeltaSink(TableFormat):
    name: ClassVar[str] = "delta"
    summary: ClassVar[str] = "a Delta Lake table, one transaction per batch"
    notes: ClassVar[str] = (
        "local disk or object stores; the Delta jars and SQL extension must be on the Spark session"
    )
    #: How many of the table's newest commits a write's read-back looks at before the whole history:
    #: ``DESCRIBE HISTORY`` reads one log file per commit it returns, so a commit's cost does not
    #: grow with the table's history (bench/sinks.py)
    recent_commits: ClassVar[int] = 20
    maintainable: ClassVar[bool] = True

    def commit_lock_reason(self, sink: str, spark_conf: Mapping[str, str]) -> str | None:
        """See :meth:`SinkFormat.commit_lock_reason`: the table's LogStore
        (:func:`log_store_class`) is one of :data:`SINGLE_DRIVER_LOG_STORES` (S3's default)."""
        store = log_store_class(sink, spark_conf)
        if store not in SINGLE_DRIVER_LOG_STORES:
            return None
        return (
            f"Delta commits {sink} with {store.rsplit('.', 1)[-1]}, which keeps a table's commits apart within one "
            "Spark driver only: two drivers (ingest and replay, each batch its own driver on the submit engine) "
            "committing the same table version at once can overwrite each other's _delta_log entry"
        )

    def batch_dataset(
        self, path: str, *, pipeline: str, batch_id: int, read_at: Mapping[str, Any] | None = None
    ) -> Any:
        """See :meth:`SinkFormat.batch_dataset`: the table at ``path`` as the batch's commit left it
        (``read_at``: its ``version``; the current version where the event names none, or where
        that version's log entries are gone: the batch's rows there are its newest attempt's),
        filtered to ``kbp_pipeline`` = ``pipeline`` and ``kbp_batch_id`` = ``batch_id``. Read with
        ``deltalake`` (delta-rs; ``pip install airflow-provider-kafka-backpressure[delta]``);
        ``s3a://`` is read as ``s3://`` with the ``AWS_*`` environment (an ``http://``
        ``AWS_ENDPOINT_URL`` is allowed)."""
        import pyarrow.dataset as ds

        table = self.table_dataset(path, read_at=read_at)
        return table.filter(
            (ds.field(PIPELINE_COLUMN) == pipeline) & (ds.field(BATCH_COLUMN) == int(batch_id))
        )

    def table_dataset(
        self, path: str, *, read_at: Mapping[str, Any] | None = None, columns: Sequence[str] | None = None
    ) -> Any:
        """See :meth:`TableFormat.table_dataset`: read with delta-rs at ``read_at``'s ``version``
        (the current version where it names none, or where that version's log entries are gone);
        lazily, so ``columns`` is the reader's projection to make."""
        from .delta_rs import delta_table

        found = delta_table(path, why=f"reading the Delta table {path} without Spark")
        if found is None:
            raise SinkFormatError(f"there is no Delta table at {path}")
        version = (read_at or {}).get("version")
        if version is not None:
            try:
                found.load_as_version(int(version))
            except Exception as e:  # delta-rs's errors for a version whose log entries were cleaned up
                log.warning(
                    "version %s of the Delta table %s cannot be read (%s); reading its current version",
                    version,
                    path,
                    e,
                )
        return found.to_pyarrow_dataset()

    def maintain(self, sink: str, options: Any) -> Any:
        """See :meth:`SinkFormat.maintain`: delta-rs's OPTIMIZE (or Z-order by ``sort_by``), the
        transaction ids' retention and VACUUM (:mod:`.delta_maintenance`)."""
        from .delta_maintenance import maintain_delta

        return maintain_delta(sink, options)

    def write_batch(
        self,
        spark: Any,
        df: Any,
        sink: str,
        *,
        pipeline: str,
        batch_id: int,
        attempt: int,
        ranges: Sequence[OffsetRange],
        expected_records: int | None = None,
        details: Mapping[str, Any] | None = None,
        merge_schema: bool = False,
        partition_by: PartitionBy | None = None,
    ) -> BatchCommit:
        # the batch's two columns first: a new table keeps Delta's column statistics (of its first
        # 32 columns by default) for them, which a rewrite and a look-up skip files by
        rows = marked_rows(df, pipeline=pipeline, batch_id=batch_id, attempt=attempt, fmt="Delta")
        metadata = batch_metadata(pipeline, batch_id, attempt, ranges, expected_records, details)
        where = f"Delta table {sink}, batch {batch_id} of pipeline {pipeline!r}"
        if attempt > 1:
            # a rewrite replaces the batch's rows: never those of another batch under the same id
            existing = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
            if existing is not None and not same_batch_offsets(existing.ranges, ranges):
                raise SinkFormatError(
                    _other_batch(
                        where, attempt, existing, ranges, "Nothing was written, the table is unchanged."
                    )
                )
        if partition_by is not None:  # kbp_day (DATE) or kbp_hour (TIMESTAMP), Delta's partition column
            rows = rows.withColumn(partition_by.name, partition_by.value(rows, where))
        writer = rows.write.format("delta")
        if partition_by is not None:
            writer = writer.partitionBy(partition_by.name)
        if merge_schema:  # a decoded value's newer compatible schema adds columns to the table
            writer = writer.option("mergeSchema", "true")
        if attempt == 1:
            # nothing of the batch can be in the table before its first attempt: a plain append,
            # whose cost does not grow with the table (see the module doc)
            writer = writer.mode("append")
        else:
            writer = writer.mode("overwrite").option("replaceWhere", batch_predicate(pipeline, batch_id))
        try:
            (
                writer.option("txnAppId", app_id(pipeline, batch_id))
                .option("txnVersion", str(int(attempt)))
                .option("userMetadata", json.dumps(metadata, sort_keys=True))
                .save(sink)
            )
        except Exception as e:
            if "DELTA_PARTITION" in str(e) or "Partition columns do not match" in str(e):
                raise SinkFormatError(_partitioning_changed(where, partition_by, e)) from e
            if not _is_concurrent_commit(e):
                raise
            # another writer committed while this one wrote: Delta's conflict check refused this
            # transaction. A newer attempt of the batch is the expected one (a zombie's late commit)
            newer = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
            if newer is not None and newer.attempt > attempt:
                raise SinkFenced(_fenced(where, attempt, newer)) from e
            raise
        # among the newest commits, unless Delta skipped the write (an older commit of the batch) or
        # other writers committed many times since (see committed())
        commit = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
        if commit is None:
            raise SinkFormatError(
                f"{where}: attempt {attempt} wrote, but the table's history has no commit of the batch holding "
                f"rows: Delta skipped the write as already done (the transactions of app id "
                f"{app_id(pipeline, batch_id)!r} name an attempt >= {attempt}) and the batch's commit holds no rows "
                "or is beyond the table's log retention; a replay's newer attempt writes the batch again"
            )
        if not same_batch_offsets(commit.ranges, ranges):
            # Delta skipped this write: the batch's app id has a version >= this attempt, set by
            # the other batch's commit
            raise SinkFormatError(
                _other_batch(
                    where,
                    attempt,
                    commit,
                    ranges,
                    f"Delta skipped this attempt's write as already done (app id {app_id(pipeline, batch_id)!r} "
                    f"has version {commit.attempt}): the planned records were not written, and the batch is not "
                    "recorded as done.",
                )
            )
        if commit.attempt > attempt:
            raise SinkFenced(_fenced(where, attempt, commit))
        if commit.attempt < attempt:
            raise SinkFormatError(
                f"{where}: attempt {attempt} did not land, the newest commit of the batch is attempt {commit.attempt}'s "
                f"(table version {commit.version}); Delta skipped the write as already done: check the table's "
                f"transactions for app id {app_id(pipeline, batch_id)!r}"
            )
        if expected_records is not None and commit.record_count != expected_records:
            raise SinkFormatError(
                f"{where}: attempt {attempt} committed {commit.record_count} rows (table version {commit.version}) "
                f"but the batch read {expected_records}; not recording it as done: a replay's newer attempt replaces it"
            )
        log.info(
            "%s: attempt %s committed %s rows as table version %s",
            where,
            attempt,
            commit.record_count,
            commit.version,
        )
        return commit

    def committed(
        self, spark: Any, sink: str, *, pipeline: str, batch_id: int, within_last: int | None = None
    ) -> BatchCommit | None:
        """See :meth:`TableFormat.committed`; ``within_last``: look at the table's newest
        ``within_last`` commits only (None if the batch's newest commit is older).

        Without ``within_last``, newest first and without reading the whole history: the table's
        newest :attr:`recent_commits` commits (a batch's commit is mostly among them: a write's
        read-back, a rewrite of a batch just committed); else, when the table holds no row of the
        batch (:meth:`holds_rows`, which reads only the batch's files), None: no commit to adopt or
        to protect (a commit of no rows further back is not looked for); else windows ten times
        larger each, back to the batch's newest commit. The look-up's cost grows with how far back
        that commit is, never with the table's size."""
        window = self.recent_commits if within_last is None else max(1, int(within_last))
        while True:
            found, exhausted = self._newest_in(spark, sink, pipeline, batch_id, window)
            if found is not None or exhausted or within_last is not None:
                return found
            if window == self.recent_commits and not self.holds_rows(
                spark, sink, pipeline=pipeline, batch_id=batch_id
            ):
                return None
            window *= 10

    def holds_rows(self, spark: Any, sink: str, *, pipeline: str, batch_id: int) -> bool:
        """Whether the table's current version holds any row of the batch. Delta's data skipping
        (the column statistics of ``kbp_pipeline`` and ``kbp_batch_id``) opens only the files that
        may hold them."""
        try:
            rows = spark.read.format("delta").load(sink).where(batch_predicate(pipeline, batch_id))
            return bool(rows.limit(1).count())
        except Exception as e:  # pyspark's AnalysisException differs between classic and Connect
            if _is_missing_table(e):
                return False
            raise

    def _newest_in(
        self, spark: Any, sink: str, pipeline: str, batch_id: int, window: int
    ) -> tuple[BatchCommit | None, bool]:
        """The batch's newest commit among the table's newest ``window`` commits (one ``DESCRIBE
        HISTORY … LIMIT``: one log file read per commit), and whether they are the whole history."""
        from pyspark.sql import functions as F

        meta = F.col("userMetadata")
        ours = (
            meta.isNotNull()
            & (F.get_json_object(meta, "$.pipeline") == F.lit(pipeline))
            & (F.get_json_object(meta, "$.batch_id") == F.lit(str(int(batch_id))))
        )
        metrics = F.col("operationMetrics")
        try:
            history = spark.sql(f"DESCRIBE HISTORY {_table_ref(sink)} LIMIT {int(window)}").select(
                "version",
                F.when(ours, meta).alias("userMetadata"),
                F.when(ours, metrics.getItem("numOutputRows")).alias("rows"),
                F.when(ours, metrics.getItem("numCopiedRows")).alias("copied"),
                F.when(ours, metrics.getItem("numOutputBytes")).alias("bytes"),
            )
            rows = history.collect()
        except Exception as e:  # pyspark's AnalysisException differs between classic and Connect
            if _is_missing_table(e):
                return None, True
            raise
        mine = [r for r in rows if r["userMetadata"] is not None]
        if not mine:
            return None, len(rows) < window
        row = max(mine, key=lambda r: int(r["version"]))
        d = json.loads(row["userMetadata"])
        expected = d.get("expected_records")
        return BatchCommit(
            pipeline=str(d["pipeline"]),
            batch_id=int(d["batch_id"]),
            attempt=int(d["attempt"]),
            ranges=tuple(OffsetRange.from_dict(r) for r in d["ranges"]),
            # the rows the commit added for the batch: a replaceWhere that rewrote a file holding
            # other batches' rows too (after an OPTIMIZE) counts the rows it copied in numOutputRows
            record_count=int(row["rows"] or 0) - int(row["copied"] or 0),
            version=int(row["version"]),
            bytes=None if row["bytes"] is None else int(row["bytes"]),
            expected_records=None if expected is None else int(expected),
            details=dict(d.get("details") or {}),
            read_at={"version": int(row["version"])},
        ), True
