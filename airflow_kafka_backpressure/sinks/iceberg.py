"""Apache Iceberg sink: each batch is one Iceberg commit, idempotent by (pipeline, batch id, attempt).

**Why pyiceberg, not Iceberg's Spark runtime.** Iceberg's Spark runtime is on Maven Central for
Spark 3.5, 4.0 (1.10.0) and 4.1 (1.12.0), not for Spark 4.2, this project's default. So Spark writes
the batch's Parquet files (any Spark version, classic or Connect) and pyiceberg commits them to the
table in the job's driver process (``add_files``: it reads each file's footer for the column
statistics). The commit is the catalog's compare-and-swap of the table's metadata pointer: a
transaction whose table changed since it was read is refused, read again and checked again.

How a batch is written (:meth:`IcebergSink.write_batch`):

* the rows get ``kbp_pipeline`` and ``kbp_batch_id`` first (as the Delta sink's), and Spark writes
  them as Parquet (timestamps as ``TIMESTAMP_MICROS``, Iceberg's) into
  ``<table>/data/kbp_batch_id=<N>/<attempt>-<uuid>/``, a directory no other write uses: files of
  an attempt that never commits are never part of the table (an orphan-file removal clears them);
* the batch's newest commit is read back from the table's snapshots (:meth:`IcebergSink.committed`,
  the ``kbp.batch`` summary property): committed by this attempt is a retry (nothing is written);
  by a newer attempt is :class:`~.base.SinkFenced`; under the same batch id with other offsets (the
  ledger's ids started again) is refused before anything is written;
* the files' row count (their footers) must be the batch's ``expected_records``, before the commit;
* one transaction: the batch's earlier rows deleted (every attempt after the first, or wherever the
  table holds a commit of the batch: files of only that batch are dropped, files a compaction
  merged are rewritten without its rows), the new files added, with ``kbp.batch`` = the batch's JSON
  (pipeline, id, attempt, ranges, expected rows, the job's details) on the append snapshot. A
  decoded value's newer compatible schema adds columns (``union_by_name``) in the same transaction.
  The transaction is pyiceberg's with its view of the table's metadata built once per staged
  update instead of on every read (:mod:`.iceberg_transaction`): a commit's cost grows far less
  with the snapshots the table keeps.

A replay of batch 5 after batches 6 and 7 lands (only batch 5's commits are compared); a zombie
attempt whose check ran before a newer attempt committed loses the catalog's swap, reads again, and
is refused.

**The catalog**: pyiceberg's SQL catalog (``sink_options.iceberg_catalog_uri``: a SQLAlchemy URL,
e.g. SQLite on one host, PostgreSQL where workers are on several), the table
``<iceberg_namespace>.<the sink's last path segment>`` at the sink's location, created by the first
batch with every column optional. Credentials never go into a pipelines file: a URL with a password
is refused (PostgreSQL reads it from ``PGPASSWORD`` or ``~/.pgpass`` on the workers).

Needs ``pip install airflow-provider-kafka-backpressure[iceberg]`` where the batch job's driver runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
import warnings
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

#: The snapshot summary property holding the batch's JSON.
BATCH_PROPERTY = "kbp.batch"
#: How many times a commit that lost the catalog's swap to another writer is read again and retried.
COMMIT_TRIES = 5
DEFAULT_NAMESPACE = "kbp"
CATALOG_NAME = "kbp"
_IDENTIFIER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def catalog_uri_problem(uri: Any) -> str | None:
    """Why ``uri`` cannot be the SQL catalog's URL (None: it can)."""
    if not isinstance(uri, str) or "://" not in uri:
        return "a SQLAlchemy URL of the catalog's database, e.g. sqlite:////data/iceberg.db or postgresql+psycopg2://kbp@db/lake"
    if urlsplit(uri).password:
        return (
            "it holds a password, which would travel in the batch's spec and logs: leave it out and give it "
            "to the workers as PGPASSWORD or in ~/.pgpass"
        )
    return None


def without_password(uri: Any) -> Any:
    """``uri`` with its password (if any) shown as ``***``."""
    if not isinstance(uri, str):
        return uri
    parts = urlsplit(uri)
    if not parts.password:
        return uri
    return parts._replace(netloc=parts.netloc.replace(":" + parts.password + "@", ":***@", 1)).geturl()


def s3_properties() -> dict[str, str]:
    """pyiceberg's S3 settings from the worker's AWS environment, as every AWS client reads it
    (credentials stay in the environment; pyarrow's S3 client reads them there): the endpoint
    (``AWS_ENDPOINT_URL``, an S3-compatible server) and the region (``AWS_REGION`` or
    ``AWS_DEFAULT_REGION``; without one pyiceberg asks AWS where the bucket is)."""
    env = os.environ
    props = {"s3.endpoint": env.get("AWS_ENDPOINT_URL", ""), "s3.region": env.get("AWS_REGION", "")}
    props["s3.region"] = props["s3.region"] or env.get("AWS_DEFAULT_REGION", "")
    return {k: v for k, v in props.items() if v}


def table_name(sink: str) -> str:
    """The table's name in the catalog: the sink's last path segment (``/lake/orders`` -> ``orders``)."""
    name = sink.rstrip("/").rsplit("/", 1)[-1]
    if not _IDENTIFIER.match(name):
        raise SinkFormatError(
            f"Iceberg sink {sink!r}: its last path segment {name!r} names the table in the catalog and must be "
            "letters, digits, underscores and hyphens (a dot would be read as a namespace): rename the sink's folder"
        )
    return name


def _batch_filter(pipeline: str, batch_id: int) -> str:
    """pyiceberg's row filter of exactly the batch's rows (a pipeline name holds no quote: its
    pattern is letters, digits, ``_``, ``.`` and ``-``)."""
    if "'" in pipeline:
        raise ValueError(f"pipeline {pipeline!r}: a pipeline name holds no quote")
    return f"{PIPELINE_COLUMN} == '{pipeline}' AND {BATCH_COLUMN} == {int(batch_id)}"


class IcebergSink(TableFormat):
    name: ClassVar[str] = "iceberg"
    summary: ClassVar[str] = "an Apache Iceberg table, one commit per batch"
    notes: ClassVar[str] = (
        "local disk; pyiceberg's SQL catalog (sink_options.iceberg_catalog_uri); pip install "
        "airflow-provider-kafka-backpressure[iceberg] where the job's driver runs"
    )
    maintainable: ClassVar[bool] = True

    def __init__(self, catalog_uri: str | None = None, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.catalog_uri = catalog_uri
        self.namespace = namespace
        self._catalog: Any = None

    @classmethod
    def configured(cls, options: Mapping[str, Any]) -> IcebergSink:
        return cls(options.get("iceberg_catalog_uri"), options.get("iceberg_namespace") or DEFAULT_NAMESPACE)

    @classmethod
    def options_problem(cls, options: Mapping[str, Any]) -> tuple[str, Any, str] | None:
        uri = options.get("iceberg_catalog_uri")
        problem = catalog_uri_problem(uri)
        if problem is not None:
            return ("iceberg_catalog_uri", without_password(uri), problem)
        return super().options_problem(options)

    # ----- the catalog -----------------------------------------------------------------------
    def catalog(self) -> Any:
        if self._catalog is None:
            problem = catalog_uri_problem(self.catalog_uri)
            if problem:
                raise SinkFormatError(
                    f"sink_options.iceberg_catalog_uri = {without_password(self.catalog_uri)!r}: {problem}"
                )
            try:
                from pyiceberg.catalog.sql import SqlCatalog
            except ImportError:
                raise SinkFormatError(
                    "the Iceberg sink needs pyiceberg where the batch job's driver runs: pip install "
                    "'airflow-provider-kafka-backpressure[iceberg]'"
                ) from None
            self._catalog = SqlCatalog(CATALOG_NAME, uri=str(self.catalog_uri), **s3_properties())
        return self._catalog

    def io(self, sink: str) -> Any:
        """pyiceberg's file IO for the table's files (the catalog's S3 properties)."""
        from pyiceberg.io import load_file_io

        return load_file_io(s3_properties(), _location(sink))

    def identifier(self, sink: str) -> str:
        return f"{self.namespace}.{table_name(sink)}"

    def load(self, sink: str) -> Any:
        """The table at ``sink``, or None before its first batch; one at another location under
        the same name is refused."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            table = self.catalog().load_table(self.identifier(sink))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        if table.location().rstrip("/") != _location(sink):
            raise SinkFormatError(
                f"Iceberg table {self.identifier(sink)} in the catalog is at {table.location()}, not at the sink "
                f"{sink}: two sinks end in the same folder name; give this pipeline another "
                "sink_options.iceberg_namespace or rename the sink's folder"
            )
        return table

    def _create(self, sink: str, arrow_schema: Any, partition_by: PartitionBy | None) -> Any:
        """The table, created with ``arrow_schema`` (every column optional: later batches may hold
        nulls) and, with ``partition_by``, Iceberg's hidden partition of that transform."""
        import pyarrow as pa
        from pyiceberg.exceptions import TableAlreadyExistsError
        from pyiceberg.transforms import DayTransform, HourTransform

        catalog = self.catalog()
        catalog.create_namespace_if_not_exists(self.namespace)
        optional = pa.schema([f.with_nullable(True) for f in arrow_schema])
        try:
            with catalog.create_table_transaction(
                self.identifier(sink), schema=optional, location=_location(sink), properties=OWN_RETRIES
            ) as tx:
                if partition_by is not None:
                    transform: Any = DayTransform() if partition_by.transform == "day" else HourTransform()
                    with tx.update_spec() as spec:
                        spec.add_field(
                            partition_by.column, transform, f"{partition_by.column}_{partition_by.transform}"
                        )
        except TableAlreadyExistsError:  # another writer created it first
            pass
        return self.load(sink)

    def batch_dataset(
        self, path: str, *, pipeline: str, batch_id: int, read_at: Mapping[str, Any] | None = None
    ) -> Any:
        """See :meth:`SinkFormat.batch_dataset`: the batch's rows in the snapshot its commit created
        (``read_at``: the snapshot and a metadata file holding it, read without the catalog), or,
        where the event names none, in the table's current snapshot through the catalog (this
        format's ``iceberg_catalog_uri``). Read with pyiceberg (the ``iceberg`` extra)."""
        import pyarrow.dataset as ds

        where = f"batch {batch_id} of pipeline {pipeline!r} in the Iceberg table at {path}"
        table, snapshot_id = self._table_at(path, read_at, where)
        # the filter in the scan: pyiceberg prunes the files by their statistics
        rows = table.scan(row_filter=_batch_filter(pipeline, batch_id), snapshot_id=snapshot_id).to_arrow()
        return ds.dataset(rows)

    def table_dataset(
        self, path: str, *, read_at: Mapping[str, Any] | None = None, columns: Sequence[str] | None = None
    ) -> Any:
        """See :meth:`TableFormat.table_dataset`: the snapshot ``read_at`` names (from its metadata
        file, without the catalog), or the current one through the catalog; read with pyiceberg,
        only ``columns`` where given."""
        import pyarrow.dataset as ds

        table, snapshot_id = self._table_at(path, read_at, f"the Iceberg table at {path}")
        fields = ("*",) if columns is None else tuple(columns)
        return ds.dataset(table.scan(snapshot_id=snapshot_id, selected_fields=fields).to_arrow())

    def _table_at(self, path: str, read_at: Mapping[str, Any] | None, where: str) -> tuple[Any, int | None]:
        """The table and snapshot id a reader reads: ``read_at``'s (its metadata file, no catalog),
        else the catalog's current snapshot (None)."""
        from pyiceberg.table import StaticTable

        table: Any
        if read_at and read_at.get("metadata"):
            try:
                table = StaticTable.from_metadata(str(read_at["metadata"]), properties=s3_properties())
            except FileNotFoundError:
                raise SinkFormatError(
                    f"{where}: the metadata file {read_at['metadata']} of its commit is gone (the table's maintenance "
                    "removed it after its retention); read the table's current snapshot through its catalog, "
                    f"filtered on {BATCH_COLUMN}"
                ) from None
            snapshot_id = read_at.get("snapshot_id")
            return table, None if snapshot_id is None else int(snapshot_id)
        table = self.load(path) if self.catalog_uri else None
        if table is None:
            raise SinkFormatError(
                f"{where}: its event names no snapshot (read_at) and no catalog is configured here; read the "
                f"table through its catalog, filtered on {BATCH_COLUMN}"
            )
        return table, None

    def maintain(self, sink: str, options: Any) -> Any:
        """See :meth:`SinkFormat.maintain`: compaction, snapshot expiry and unreferenced files,
        through pyiceberg (:mod:`.iceberg_maintenance`)."""
        from .iceberg_maintenance import maintain_iceberg

        return maintain_iceberg(self, sink, options)

    # ----- the commit ------------------------------------------------------------------------
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
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        from .iceberg_files import file_schema, rows_in, write_files
        from .iceberg_transaction import MemoTransaction

        rows = marked_rows(df, pipeline=pipeline, batch_id=batch_id, attempt=attempt, fmt="Iceberg")
        where = f"Iceberg table {self.identifier(sink)} at {sink}, batch {batch_id} of pipeline {pipeline!r}"
        table = _retried_here(self.load(sink))
        held = None if table is None else _newest_commit(table, pipeline, batch_id)
        done = self._settled(where, attempt, held, ranges)
        if done is not None:
            return done
        if table is not None:
            _check_partitioning(where, table, partition_by)
        if partition_by is not None:
            # one partition's rows per file: pyiceberg reads each file's partition from its stats
            rows = rows.withColumn(partition_by.name, partition_by.number(rows, where))
        files = write_files(
            spark,
            rows,
            f"{sink.rstrip('/')}/data/{BATCH_COLUMN}={int(batch_id)}/{int(attempt)}-{uuid.uuid4().hex}",
            None if partition_by is None else partition_by.name,
        )
        io = self.io(sink)
        schema = file_schema(io, files[0]) if files else None  # the batch's columns, read once
        if table is None:
            table = self._create(sink, schema, partition_by) if schema is not None else None
        if table is None:  # an empty first batch of a new table: no schema to create it with yet
            raise SinkFormatError(
                f"{where}: the batch has no rows and the table does not exist yet; it is created by the first "
                "batch with rows"
            )
        written = rows_in(io, files)
        if expected_records is not None and written != expected_records:
            raise SinkFormatError(
                f"{where}: attempt {attempt} wrote {written} rows but the batch must publish {expected_records}; "
                "nothing was committed"
            )
        metadata = batch_metadata(pipeline, batch_id, attempt, ranges, expected_records, details)
        for _ in range(COMMIT_TRIES):
            try:
                with MemoTransaction(table) as tx:  # its metadata built once per update, not per read
                    if merge_schema and schema is not None:
                        with tx.update_schema() as update:
                            update.union_by_name(schema)
                    if held is not None or attempt > 1:  # a rewrite: the batch's earlier rows go
                        with warnings.catch_warnings():  # a replay of a batch never committed has none
                            warnings.filterwarnings("ignore", "Delete operation did not match any records")
                            tx.delete(_batch_filter(pipeline, batch_id))
                    tx.add_files(
                        files,
                        snapshot_properties={BATCH_PROPERTY: json.dumps(metadata, sort_keys=True)},
                        check_duplicate_files=False,  # each attempt writes into a folder of its own
                    )
                break
            except (CommitFailedException, ValidationException):
                # another writer committed since the table was read (the catalog refused the swap,
                # or its commit added rows of this batch): read it again, check again
                table = self.load(sink)
                held = _newest_commit(table, pipeline, batch_id)
                done = self._settled(where, attempt, held, ranges)
                if done is not None:
                    return done
        else:
            raise SinkFormatError(
                f"{where}: attempt {attempt} lost the catalog's swap {COMMIT_TRIES} times to other writers; "
                "a retry of the task commits it"
            )
        commit = _newest_commit(table, pipeline, batch_id)  # the transaction left the table as committed
        if commit is None or commit.attempt != attempt:
            raise SinkFormatError(
                f"{where}: attempt {attempt} committed, but the table's snapshots do not show it"
            )
        log.info(
            "%s: attempt %s committed %s rows as snapshot %s",
            where,
            attempt,
            commit.record_count,
            commit.version,
        )
        return commit

    def _settled(
        self, where: str, attempt: int, held: BatchCommit | None, ranges: Sequence[OffsetRange]
    ) -> BatchCommit | None:
        """What the table's newest commit of the batch decides before a write: this attempt's (a
        retry: return it), a newer one's (refused), another batch's under the id (refused); None:
        write."""
        if held is None:
            return None
        if not same_batch_offsets(held.ranges, ranges):
            done = "Nothing was written, the table is unchanged."
            raise SinkFormatError(
                other_batch_message(where, attempt, held, ranges, done, f"snapshot {held.version}")
            )
        if held.attempt > attempt:
            raise SinkFenced(fenced_message(where, attempt, held, f"snapshot {held.version}"))
        return held if held.attempt == attempt else None

    def committed(self, spark: Any, sink: str, *, pipeline: str, batch_id: int) -> BatchCommit | None:
        table = self.load(sink)
        return None if table is None else _newest_commit(table, pipeline, batch_id)


def _check_partitioning(where: str, table: Any, partition_by: PartitionBy | None) -> None:
    """An existing table's partitioning must be the pipeline's ``partition_by``."""
    have = [(table.schema().find_column_name(f.source_id), str(f.transform)) for f in table.spec().fields]
    want = [] if partition_by is None else [(partition_by.column, partition_by.transform)]
    if have != want:
        shown = ", ".join(f"{t}({c})" for c, t in have) or "none"
        given = ", ".join(f"{t}({c})" for c, t in want) or "none"
        raise SinkFormatError(
            f"{where}: the table is partitioned by {shown} but the pipeline's sink_options.partition_by is "
            f"{given}. Nothing was written. Set partition_by back to what the table has, or point the "
            "pipeline at a new table (its sink)"
        )


#: pyiceberg retries a refused commit on the table read again by itself, without the batch's fence
#: checked again (a zombie first attempt would append beside a newer attempt's rows): the sink
#: retries instead (``COMMIT_TRIES``), checking first
OWN_RETRIES = {"commit.retry.num-retries": "0"}


def _retried_here(table: Any) -> Any:
    """``table`` with pyiceberg's own commit retries off (:data:`OWN_RETRIES`): a table this sink
    did not create gets the property once, in a commit of its own."""
    if table is None or all(table.properties.get(k) == v for k, v in OWN_RETRIES.items()):
        return table
    log.info("Iceberg table %s: setting %s (the sink retries its commits itself)", table.name(), OWN_RETRIES)
    with table.transaction() as tx:
        tx.set_properties(**OWN_RETRIES)
    return table


def _location(sink: str) -> str:
    """The table's location: the sink as given, without a trailing slash."""
    return sink.rstrip("/")


def _newest_commit(table: Any, pipeline: str, batch_id: int) -> BatchCommit | None:
    """The batch's newest commit among the table's snapshots (their ``kbp.batch`` property)."""
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True):
        raw = (snapshot.summary.additional_properties if snapshot.summary else {}).get(BATCH_PROPERTY)
        if raw is None:
            continue
        d = json.loads(raw)
        if d.get("pipeline") != pipeline or int(d.get("batch_id", -1)) != int(batch_id):
            continue
        props = snapshot.summary.additional_properties
        expected = d.get("expected_records")
        return BatchCommit(
            pipeline=pipeline,
            batch_id=int(batch_id),
            attempt=int(d["attempt"]),
            ranges=tuple(OffsetRange.from_dict(r) for r in d["ranges"]),
            record_count=int(props.get("added-records", 0)),
            version=int(snapshot.snapshot_id),
            bytes=int(props.get("added-files-size", 0)),
            expected_records=None if expected is None else int(expected),
            details=dict(d.get("details") or {}),
            # the snapshot, and a metadata file that holds it: a reader needs no catalog
            read_at={"snapshot_id": int(snapshot.snapshot_id), "metadata": table.metadata_location},
        )
    return None
