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
   (:mod:`.arrow_writer`: whole files renamed into place, the same commit);
3. *commit* — an empty write to ``kbp_batch_sink`` whose ``commit`` (which Spark runs on the driver
   side) publishes the staging directory as the batch. If the data job fails, an *abort* write
   removes the staging directory instead (a crash leaves it: a hidden leftover the next commit of the
   batch removes).

The Data Source carries no rows: the Python code that must run where the sink is visible (the
driver side of the cluster, not a Connect client) runs in its writer's constructor and ``commit``.
In a classic session (the submit engine) the calling process *is* the driver: steps 1 and 3 then
run in it directly, without a Spark job, and the manifest is read back directly too.
Files go through :mod:`airflow_kafka_backpressure.storage` (pyarrow filesystems: local paths,
``s3://``/``s3a://``, ``gs://``, ``hdfs://`` …); Spark writes the same URI through Hadoop.

Layout under the sink root::

    <sink>/batch_id=<N>/part-*.parquet        the batch's data (Hive-style partition directory)
    <sink>/batch_id=<N>/_manifest.json        what the batch holds (see below)
    <sink>/_kbp_staging_<N>_<token>/          a write in progress, or one a crash left behind
    <sink>/_kbp_replaced_<N>_<token>/         a previous version being removed
    <sink>/_kbp_fence_<N>/<attempt>_<token>   the attempts that started writing and have not
                                              committed yet (:mod:`.fencing`; a commit removes its
                                              own and older ones, and the directory once empty)

Names starting with ``_`` are skipped by Spark's and pyarrow's dataset readers (temporary names
contain no ``=``: Spark would take ``_x=y`` for a partition directory), so readers of the root see
each batch once or not at all.

What the commit does, and what a crash after each step leaves:

1. keep exactly the Parquet files Spark's committer published in the staging directory (its
   ``_SUCCESS`` marker, checksum files and anything else are deleted);
2. collect the reader's completion records (``_read/``: one per input partition read to its end,
   with the executor that read it), so the manifest counts the records *read* per topic-partition,
   whatever the transform did;
3. write ``_manifest.json`` into the staging directory — crash: a hidden leftover;
4. refuse to replace a committed batch that belongs to another pipeline or other offset ranges (a
   reset ledger or two pipelines sharing a sink would otherwise overwrite older output), and refuse
   to commit when a newer attempt of the same batch started writing or committed it (fencing by
   the ledger's attempt number, :mod:`.fencing`);
5. swap staging in as ``batch_id=<N>`` — the commit:

   * local filesystems (Linux): if ``batch_id=<N>`` exists, ``renameat2(RENAME_EXCHANGE)`` swaps
     the two directories in one atomic step (readers see the old version or the new one, never
     neither, never both); else ``renameat2(RENAME_NOREPLACE)`` (refused if another attempt
     committed meanwhile);
   * fallback (object stores, HDFS, filesystems without renameat2): rename the committed version
     to ``_kbp_replaced_<N>_<token>``, then staging to ``batch_id=<N>`` — between the two renames
     the batch is briefly absent (never duplicated); a crash there fails the job, and its retry
     rewrites the batch. On S3 this step fails today: pyarrow cannot rename a directory there
     (``NO_SUCH_KEY`` on a ``CopyObject`` of the directory key), so the commit raises and leaves the
     staging directory (``tests/integration/test_s3_server.py``; issue 22);
6. delete the replaced version and this batch's other leftovers.

Re-running a batch therefore always converges to exactly one copy of its records. An empty batch is
still committed: one schema-only Parquet file plus the manifest.

Manifest fields: ``manifest_version``, ``batch_id``, ``token`` and ``attempt`` (the attempt that wrote
it: its token and the ledger's attempt number, or null), ``written_at_ms``, ``format``, ``files``
([{name, bytes, rows}]), ``rows`` (written), ``executors`` (distinct executors that read the batch's
ranges: named by the Python reader's completion records, or for the native reader by the driver's
status store; when none is known — an empty batch, a Connect session's native read — at least one
if Spark wrote a file), ``ranges``, ``partitions``
([{topic, partition, records}] read), ``records``, ``bytes`` (key + value bytes read), ``unread``
(ranges the job did not read to their end, or read without counting — the transform did not
consume them, or it read them with the native reader; their counts come from a second read), and what the caller passes as ``describe`` (pipeline, run id, reader,
transform).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from airflow_kafka_backpressure.models import OffsetRange, batch_path
from airflow_kafka_backpressure.spark import registry
from airflow_kafka_backpressure.spark.completion import (
    completed_reads,
    observe_reads,
    observe_rows,
    tally_reads,
)
from airflow_kafka_backpressure.spark.executors import executors_that_ran
from airflow_kafka_backpressure.spark.fencing import (
    clear_fence,
    fence_markers,
    fence_problem,
    raise_fence,
    read_fence,
)
from airflow_kafka_backpressure.spark.manifest_source import (
    MANIFEST_NAME,
    BatchManifestDataSource,
    _manifest_at,
    committed_manifest,
    read_manifest,
)
from airflow_kafka_backpressure.storage import Location, StorageError, location

SINK_SOURCE_NAME = "kbp_batch_sink"
STAGING_PREFIX = "_kbp_staging_"
REPLACED_PREFIX = "_kbp_replaced_"
READ_DIR = "_read"
MANIFEST_VERSION = 2


class SinkError(RuntimeError):
    """The sink could not be written or committed; the message says what to do."""


def staging_dir_name(batch_id: int, token: str) -> str:
    return f"{STAGING_PREFIX}{int(batch_id)}_{token}"


def batch_dir_name(batch_id: int) -> str:
    return batch_path("", batch_id).lstrip("/")


def staging_uri(sink: str, batch_id: int, token: str) -> str:
    """The staging directory of attempt ``token`` (string only: a Connect client may not be able to
    build the sink's filesystem, and needs none to name it)."""
    return sink.rstrip("/") + "/" + staging_dir_name(batch_id, token)


def read_records_dir(sink: str, batch_id: int, token: str) -> str:
    """Where the reader records the input partitions it read completely (inside the staging dir)."""
    return staging_uri(sink, batch_id, token) + "/" + READ_DIR


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
        except (KeyError, ValueError, TypeError) as e:
            raise SinkError(
                f"{SINK_SOURCE_NAME}: options sink, batchId, token and ranges are required ({e})"
            ) from e
        self.stage = opts.get("stage", "")
        if self.stage not in STAGES:
            raise SinkError(
                f"{SINK_SOURCE_NAME}: option stage={self.stage!r} must be one of {', '.join(STAGES)}; write a "
                "batch with airflow_kafka_backpressure.spark.sink.write_batch(spark, df, sink, batch_id, ...)"
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
            )
        elif self.stage == "abort":
            try:
                self._staging().delete()
            except StorageError:
                pass  # a leftover is hidden and removed by the next attempt's commit


def _write_empty_file(staging: Location, schema: StructType, compression: str) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    name = f"part-00000-empty.{compression}.parquet"
    target = staging.child(name)
    pq.write_table(
        to_arrow_schema(schema, timezone="UTC").empty_table(),
        target.path,
        filesystem=target.fs,
        compression=compression,
    )
    return {"name": name, "bytes": int(target.fs.get_file_info(target.path).size), "rows": 0}


def _published_files(staging: Location) -> list[dict[str, Any]]:
    """The Parquet files Spark's committer published in ``staging`` ({name, bytes, rows}, rows from
    each file's footer); every other entry but the reader's records is deleted."""
    import pyarrow.parquet as pq

    files = []
    for name, is_dir, size in staging.children():
        if name == READ_DIR and is_dir:
            continue
        if is_dir or name.startswith(("_", ".")) or not name.endswith(".parquet"):
            staging.child(name).delete()  # _SUCCESS, checksum files, an aborted task's _temporary
            continue
        f = staging.child(name)
        try:
            rows = pq.read_metadata(f.path, filesystem=f.fs).num_rows
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot read the Parquet footer of {f.uri}: {e}") from e
        files.append({"name": name, "bytes": int(size), "rows": int(rows)})
    return sorted(files, key=lambda f: f["name"])


def check_replaceable(
    existing: dict[str, Any] | None, describe: dict[str, Any], ranges: Sequence[OffsetRange], where: str
) -> None:
    """Refuse to replace a committed batch written for another pipeline or other offsets (pure).

    A replay of the same pipeline's batch that writes the planned ranges trimmed at their start
    (retention or a topic reset took offsets, and the committed version could not be adopted: it is
    incomplete) replaces it: the same batch, every offset it still holds read again."""
    if existing is None:
        return
    theirs_pipeline = existing.get("pipeline")
    theirs = sorted(OffsetRange.from_dict(r) for r in existing.get("ranges", ()))
    ours = sorted(r for r in ranges)
    if theirs_pipeline != describe.get("pipeline"):
        raise SinkError(
            f"{where} already holds a batch of another pipeline, {theirs_pipeline!r} (this is "
            f"{describe.get('pipeline')!r}): two pipelines share this sink. Refusing to overwrite its data: give "
            "each pipeline its own sink, then replay this batch"
        )
    if theirs == ours or _trimmed(theirs, ours):
        return
    raise SinkError(
        f"{where} already holds this pipeline's batch with ranges {', '.join(map(str, theirs)) or 'none'}, not "
        f"{', '.join(map(str, ours)) or 'none'}: the batch id belongs to other offsets, so the ledger was reset, "
        "restored from an older backup or pointed elsewhere (its batch ids started again). Refusing to overwrite "
        "that data: move the sink's old output away (or give the pipeline a new sink) and replay the batch"
    )


def _trimmed(theirs: Sequence[OffsetRange], ours: Sequence[OffsetRange]) -> bool:
    """``ours`` is ``theirs`` with some ranges starting later (same partitions, same ends)."""
    mine = {r.tp: r for r in ours}
    return set(mine) == {r.tp for r in theirs} and all(
        mine[r.tp].until_offset == r.until_offset and mine[r.tp].from_offset >= r.from_offset for r in theirs
    )


def commit_batch(
    sink: str,
    batch_id: int,
    token: str,
    ranges: Sequence[OffsetRange],
    describe: dict[str, Any],
    schema: StructType,
    compression: str = "snappy",
    *,
    attempt: int | None = None,
    reads: Sequence[tuple[OffsetRange, int, int]] = (),
    read_by: Sequence[str] = (),
    written_rows: int | None = None,
) -> dict[str, Any]:
    """Publish the staging directory of attempt ``token`` as batch ``batch_id`` (see the module doc).
    ``reads``: ranges read to their end, with their records and key+value bytes, known on the
    driver (the native reader's observed counts) rather than left as completion records, and
    ``read_by`` the executors that read them. ``written_rows``: the rows the writer wrote (Spark
    counted them as they went to its Parquet writer, after the transform; the arrow writer's tasks
    report theirs): the published files must hold exactly as many, or nothing is published."""
    root = location(sink)
    staging = root.child(staging_dir_name(batch_id, token))
    final = root.child(batch_dir_name(batch_id))
    try:
        staging.mkdirs()
        files = _published_files(staging)
        read_dir = staging.child(READ_DIR)
        completed, executors = completed_reads(read_dir)
        executors |= set(read_by)
        counts, nbytes, unread = tally_reads(ranges, [*completed, *reads])
        read_dir.delete()
        seen = sum(int(f["rows"]) for f in files)
        if written_rows is not None and seen != written_rows:
            staging.delete()
            raise SinkError(
                f"batch {batch_id}: the writer wrote {written_rows} rows but the committing side sees {seen} "
                f"in {len(files)} Parquet file(s) under {staging.uri}; nothing was published. The files were "
                "written where the Spark driver cannot see them (a local sink path while executors run on "
                "other hosts: use a path every executor and the driver share, such as HDFS, S3 or a shared "
                "mount) or removed during the commit"
            )
        # executors: those that read the ranges; none read (an empty batch, the native reader): at
        # least the one that wrote a file
        n_executors = len(executors) or (1 if files else 0)
        if not files:
            files = [_write_empty_file(staging, schema, compression)]
        manifest: dict[str, Any] = {
            "manifest_version": MANIFEST_VERSION,
            "batch_id": int(batch_id),
            "token": token,
            "attempt": attempt,
            **describe,
            "ranges": [r.to_dict() for r in ranges],
            "partitions": [
                {"topic": r.topic, "partition": r.partition, "records": counts[r.tp]}
                for r in ranges
                if r.tp in counts
            ],
            "records": sum(counts.values()),
            "bytes": nbytes,
            "unread": [r.to_dict() for r in unread],
            "rows": sum(int(f["rows"]) for f in files),
            "executors": n_executors,
            "format": "parquet",
            "files": files,
            "written_at_ms": int(time.time() * 1000),
        }
        staging.child(MANIFEST_NAME).write_bytes(json.dumps(manifest, sort_keys=True).encode())

        existing = _manifest_at(final) if final.exists() else None
        try:
            check_replaceable(existing, describe, ranges, final.uri)
            problem = fence_problem(batch_id, attempt, token, read_fence(root, batch_id), existing)
            if problem:
                raise SinkError(problem)
        except SinkError:
            staging.delete()
            committed_by = None if existing is None else existing.get("attempt")
            if attempt is not None and committed_by is not None and int(committed_by) > attempt:
                # a zombie refused by the committed version: its marker (and any older) is redundant
                clear_fence(root, batch_id, int(committed_by))
            raise
        _swap_in(root, staging, final, batch_id, token, replace=existing is not None or final.exists())
        _delete_leftovers(root, batch_id, attempt)
        if attempt is not None:
            clear_fence(root, batch_id, attempt)
        return manifest
    except StorageError as e:
        raise SinkError(f"batch {batch_id}: cannot commit to sink {sink!r}: {e}") from e


def _delete_leftovers(root: Location, batch_id: int, attempt: int | None) -> None:
    """After a commit: the replaced version, and the staging directories of this attempt and older
    ones (crashes, aborted writes). A newer attempt's staging directory is its write in progress:
    it stays (its attempt is known from its fence marker, raised before it writes)."""
    attempts = fence_markers(root, batch_id)
    staging = f"{STAGING_PREFIX}{int(batch_id)}_"
    for name, _, _ in root.children():
        if name.startswith(f"{REPLACED_PREFIX}{int(batch_id)}_"):
            root.child(name).delete()
        elif name.startswith(staging):
            theirs = attempts.get(name[len(staging) :])
            if theirs is None or attempt is None or theirs <= attempt:
                root.child(name).delete()


def _swap_in(
    root: Location, staging: Location, final: Location, batch_id: int, token: str, *, replace: bool
) -> None:
    """Publish ``staging`` as ``final`` (module doc, step 5); the old version ends up under a
    leftover name that the caller deletes."""
    if replace:
        if staging.exchange_with(final):  # atomic: staging now holds the previous version
            return
        replaced = root.child(f"{REPLACED_PREFIX}{int(batch_id)}_{token}")
        final.move_to(replaced)
        try:
            staging.move_to(final)
        except StorageError:
            if not final.exists():
                replaced.move_to(final)  # put the previous version back; the retry replaces it
            raise
        return
    if not staging.move_no_replace(final):
        staging.delete()
        raise SinkError(
            f"batch {batch_id}: another attempt committed {final.uri} while this one (token {token[:8]}…) "
            "was committing; this attempt's output is discarded — run the batch again if it is still unfinished"
        )


def leftovers(sink: str, batch_id: int) -> list[str]:
    """Names of this batch's temporary directories under the sink root (crashes, or a running write)."""
    prefixes = (f"{STAGING_PREFIX}{int(batch_id)}_", f"{REPLACED_PREFIX}{int(batch_id)}_")
    return sorted(name for name, _, _ in location(sink).children() if name.startswith(prefixes))


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
    registry.register(spark, BatchSinkDataSource, BatchManifestDataSource)


#: Columns of the Kafka schema Parquet should not try to dictionary-encode: offsets are unique in a
#: partition, and keys and values nearly always are within a batch. Parquet's writer builds a
#: dictionary for each column chunk's first pages and, for such columns, throws it away once it
#: outgrows its limit, writing the same PLAIN pages it would have written without one. Measured in
#: interleaved A/B runs (1,000 records per producer batch, local[1]; docs/benchmarks.md): the
#: Parquet write's cost over a no-op sink fell from 0.24 s to 0.10 s per 100,000 records.
PLAIN_COLUMNS: tuple[str, ...] = ("key", "value", "offset")


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
) -> dict[str, Any]:
    """Write ``df`` as batch ``batch_id`` of ``sink`` (replacing any previous version whole) and
    return the committed manifest, read back where Spark runs. ``token`` names the attempt (its
    staging directory, where the reader leaves its completion records); default: a fresh one.
    ``plain_columns``: the columns written without dictionary encoding (default
    :data:`PLAIN_COLUMNS`; names ``df`` lacks are ignored). ``write_data``: writes the data into
    the staging URI it is given instead of Spark's Parquet writer (``df`` then gives the schema
    only; :mod:`.arrow_writer`) and returns the rows it wrote (None: not known); the fence and
    commit are the same. The commit checks the rows it publishes against the rows written
    (:func:`commit_batch`). ``count_reads``: ``df`` is the
    batch's Kafka records as read, every range to its end (the native reader, no transform): Spark
    counts each range's records and bytes while it writes them (``DataFrame.observe``), and the
    counts travel to the commit in its options (see :func:`commit_batch`)."""
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
    if write_data is None and observed is None:
        data, rows = observe_rows(data)
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
    except Exception:
        try:
            stage("abort")
        except Exception:  # noqa: BLE001 - the write's own error is the one to report
            pass
        raise
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
