"""Table formats: a batch committed as one transaction of a table that holds every batch (Delta).

A :class:`TableFormat` implements two things, :meth:`~TableFormat.write_batch` (a DataFrame as one
commit, idempotent by pipeline, batch id and attempt) and :meth:`~TableFormat.committed` (what a
batch last committed); the batch job's write and a replay's adoption come with it:

1. **adopt** (a replay of a batch whose earlier attempt may have committed): the sink's newest
   commit of the batch, if it holds the planned ranges (or those this run would write) and the rows
   recorded with it as the batch's to publish (a commit its writer's row check refused stays in the
   table, and is not adopted), is taken over without reading Kafka, whichever attempt wrote it;
2. **read** once: what the job read is persisted, so that the per-partition counts and the rows
   written come from the same data (:meth:`TableWrite.counted`);
3. **commit** the transformed rows as one transaction, fenced by the ledger's attempt number and
   checked against the rows that must land (the records read, or what the transform returned):
   another count fails the batch (no empty or partial success). The transform's output is
   persisted, then counted and written from the same data: the transform runs once per batch.

The per-partition counts go into the commit (``details``), so adoption gives the controller the
same metrics as the run that wrote it.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec, OffsetRange, TopicPartition

from .base import BatchSource, BatchWrite, CommittedBatch, SetAside, SinkFormat, SinkFormatError, ranges_read

log = logging.getLogger(__name__)

#: The two columns a table format adds to each batch's rows, first (a new table keeps column
#: statistics for them, which a rewrite and a look-up of the batch skip files by).
PIPELINE_COLUMN = "kbp_pipeline"
BATCH_COLUMN = "kbp_batch_id"


def marked_rows(df: Any, *, pipeline: str, batch_id: int, attempt: int, fmt: str) -> Any:
    """``df`` with ``kbp_pipeline`` and ``kbp_batch_id`` first, after the checks every table
    format's ``write_batch`` makes of its arguments (``fmt``: the format, for the messages)."""
    from pyspark.sql import functions as F

    if not pipeline:
        raise ValueError("pipeline must be a non-empty string")
    if batch_id < 0:
        raise ValueError(f"batch {batch_id}: batch_id must be >= 0")
    if attempt < 1:
        raise ValueError(
            f"batch {batch_id}: attempt must be >= 1 (the ledger's attempt number), got {attempt}"
        )
    for column in (PIPELINE_COLUMN, BATCH_COLUMN):
        if column in df.columns:
            raise SinkFormatError(
                f"batch {batch_id}: the batch's rows already have a column {column!r}, which the {fmt} sink adds"
            )
    return df.select(
        F.lit(pipeline).alias(PIPELINE_COLUMN), F.lit(int(batch_id)).cast("long").alias(BATCH_COLUMN), "*"
    )


@dataclass(frozen=True)
class PartitionBy:
    """``sink_options.partition_by``: the UTC ``transform`` (``day`` or ``hour``) of ``column``, as
    Iceberg's partition transforms compute it (days or hours since 1970-01-01 UTC), whatever the
    Spark session's time zone."""

    transform: str
    column: str

    @classmethod
    def parse(cls, value: str | None) -> PartitionBy | None:
        from airflow_kafka_backpressure.batch.options import PARTITION_BY

        if value is None:
            return None
        match = PARTITION_BY.match(value)
        if match is None:
            raise SinkFormatError(
                f"sink_options.partition_by = {value!r}: use day(<column>) or hour(<column>)"
            )
        return cls(match.group(1), match.group(2))

    @property
    def name(self) -> str:
        """The partition column a format adds (Delta) or splits its files by (Iceberg)."""
        return f"kbp_{self.transform}"

    def number(self, df: Any, where: str) -> Any:
        """The partition's number (days or hours since the epoch, UTC) of each row of ``df``, a
        Column; a missing column or one of another type is refused naming the columns there are."""
        from pyspark.sql import functions as F

        fields = {f.name: f.dataType.typeName() for f in df.schema.fields}
        kind = fields.get(self.column)
        if kind not in ("timestamp", "timestamp_ntz", "date") or (
            kind == "date" and self.transform == "hour"
        ):
            usable = sorted(n for n, k in fields.items() if k in ("timestamp", "timestamp_ntz", "date"))
            raise SinkFormatError(
                f"{where}: sink_options.partition_by {self.transform}({self.column}) needs a timestamp column"
                f"{' or a date' if self.transform == 'day' else ''} named {self.column!r}; the batch's rows have "
                f"{'none' if kind is None else 'it as ' + str(kind)}. Timestamp and date columns there: "
                f"{', '.join(usable) or 'none'}"
            )
        if kind == "date":
            return F.unix_date(F.col(self.column))
        per = 86_400_000_000 if self.transform == "day" else 3_600_000_000
        return F.floor(F.unix_micros(F.col(self.column).cast("timestamp")) / F.lit(per))

    def value(self, df: Any, where: str) -> Any:
        """The partition column's value of each row: a DATE (day) or the hour's start, a TIMESTAMP."""
        from pyspark.sql import functions as F

        number = self.number(df, where)
        if self.transform == "day":
            return F.date_from_unix_date(number.cast("int"))
        return F.timestamp_seconds(number * F.lit(3600))


def batch_metadata(
    pipeline: str,
    batch_id: int,
    attempt: int,
    ranges: Sequence[OffsetRange],
    expected_records: int | None,
    details: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What a table format stores with a batch's commit (JSON): its identity, ranges, the rows it
    must publish and the job's details; read back as a :class:`BatchCommit`."""
    return {
        "kbp": 1,
        "pipeline": pipeline,
        "batch_id": int(batch_id),
        "attempt": int(attempt),
        "ranges": [r.to_dict() for r in sorted(ranges)],
        "expected_records": expected_records,
        "details": dict(details or {}),
    }


def fenced_message(where: str, attempt: int, newer: BatchCommit, version: str) -> str:
    """A zombie attempt's refusal: a newer attempt committed the batch (``version``: how the format
    names its commit, e.g. ``table version 7``)."""
    return (
        f"{where}: attempt {attempt} was refused, attempt {newer.attempt} has committed the batch "
        f"({version}); this attempt is stale and must not be recorded"
    )


def other_batch_message(
    where: str, attempt: int, commit: BatchCommit, planned: Sequence[OffsetRange], done: str, version: str
) -> str:
    """The refusal of a batch id the table already holds for other offsets (``done``: what
    happened to this attempt's rows; ``version``: the commit as the format names it)."""

    def text(ranges: Sequence[OffsetRange]) -> str:
        return ", ".join(map(str, sorted(ranges))) or "none"

    return (
        f"{where}: the table already holds this batch id with ranges {text(commit.ranges)} (attempt "
        f"{commit.attempt}, {version}), but attempt {attempt} was planned with ranges "
        f"{text(planned)}. The batch id belongs to other offsets: the ledger was reset, restored from "
        f"an older backup or pointed at another database, and its batch ids started again. {done} Point the "
        "pipeline at a new table (its sink) or restore the ledger from a backup at least as new as the table, "
        "then replay the batch; batch ids must never be reused for other offsets in one table"
    )


def same_batch_offsets(committed: Sequence[OffsetRange], planned: Sequence[OffsetRange]) -> bool:
    """Whether a commit of ``committed`` ranges holds the batch planned as ``planned`` (pure): the same
    ranges, or the same partitions with the same ends where either starts later (a replay that
    retention or a topic reset trimmed at the start, or the full plan rewritten after such a
    replay). Other ranges under the same batch id are another batch: the ledger's batch ids started
    again (a reset, a restore from an older backup, another ledger)."""
    theirs = {r.tp: r for r in committed}
    ours = {r.tp: r for r in planned}
    if len(theirs) != len(committed) or len(ours) != len(planned) or set(theirs) != set(ours):
        return False
    return all(theirs[tp].until_offset == r.until_offset for tp, r in ours.items())


@dataclass(frozen=True)
class BatchCommit:
    """What one batch committed, as the sink records it: the pipeline, batch id, the ledger's
    attempt number that wrote it, the offset ranges it holds and its row count (the batch's rows the
    commit published, counted by the sink: rows of other batches it copied are not counted).
    ``version``: the sink's own version of the commit (a Delta table version), when it has one;
    ``bytes``: the data it added, when the sink says; ``expected_records``: the rows the writer said
    the batch must publish (None if it did not say); ``details``: what the writer stored with the
    commit (the job's per-partition record counts); ``read_at``: what a reader needs to read the
    table as this commit left it (JSON-able; the format's :meth:`~.base.SinkFormat.batch_dataset`
    takes it), or None."""

    pipeline: str
    batch_id: int
    attempt: int
    ranges: tuple[OffsetRange, ...]
    record_count: int
    version: int | None = None
    # what the sink reports beside the commit's identity: not compared
    bytes: int | None = field(default=None, compare=False)
    expected_records: int | None = field(default=None, compare=False)
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)
    read_at: Mapping[str, Any] | None = field(default=None, compare=False)

    def count_problem(self) -> str | None:
        """Why the commit does not hold the rows its batch must publish (its row count is not the
        ``expected_records`` recorded with it), or None: a commit a writer's check refused stays in
        the sink, and must not be taken over as the batch's output."""
        if self.expected_records is None or self.record_count == self.expected_records:
            return None
        return (
            f"it holds {self.record_count} rows of the batch but the batch must publish {self.expected_records} "
            f"(attempt {self.attempt}'s own check refused it)"
        )

    def reported(self) -> CommittedBatch:
        """What the job reports of this commit: the counts the job stored with it (``details``)."""
        counts = {
            TopicPartition(str(c["topic"]), int(c["partition"])): int(c["records"])
            for c in self.details.get("partitions", ())
        }
        return CommittedBatch(
            ranges=self.ranges,
            partitions=counts,
            records=sum(counts.values()) if counts else self.record_count,
            bytes=int(self.bytes or 0),
            executors=int(self.details.get("executors", 1 if self.record_count else 0)),
            read_by=self.details.get("reader"),
            bad_records=int(self.details.get("bad_records") or 0),
            read_at=None if self.read_at is None else dict(self.read_at),
        )


class TableFormat(SinkFormat):
    """A sink format that commits a batch's DataFrame as one transaction of a table (module doc).

    The contract of :meth:`write_batch`: ONE commit, idempotent by (pipeline, batch id, attempt): a
    retry of a committed attempt changes nothing; a newer attempt replaces the batch's rows (never
    appends beside them); an older attempt after a newer one is refused with
    :class:`~.base.SinkFenced`; a replay of an old batch after newer ones lands. :meth:`committed`
    reads back what the batch committed (None if nothing)."""

    partitions: ClassVar[bool] = True

    @abc.abstractmethod
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
        """Commit ``df`` as batch ``batch_id`` of ``pipeline`` by the ledger's attempt ``attempt``
        (>= 1, growing with every new attempt of the batch). ``expected_records``: the rows the batch
        must publish (what was read, or what the transform returned); a commit of another count
        raises :class:`~.base.SinkFormatError`. ``details``: JSON-able facts stored with the commit
        and read back in :attr:`BatchCommit.details`. ``merge_schema``: columns ``df`` has and the
        table lacks are added to the table (a decoded value's schema gained a field).
        ``partition_by``: the table's partitioning by event time (fixed when it is created; another
        one on an existing table is refused). Returns what the sink now holds for the batch."""

    def table_dataset(
        self, path: str, *, read_at: Mapping[str, Any] | None = None, columns: Sequence[str] | None = None
    ) -> Any:
        """Every row of the table at ``path`` as a ``pyarrow.dataset.Dataset``, read without Spark:
        as a commit's ``read_at`` left it, or the current version; ``columns``: the columns the
        reader needs (a format that reads eagerly reads only those; the dataset may hold more).
        :meth:`batch_dataset` is this, filtered to one batch (a format may prune files by the batch
        while it reads). Default: refused, the format gives no such reader."""
        raise ValueError(f"sink_format {self.name!r} has no reader here: read the table {path} with Spark")

    def error_table(self, sink: str) -> str:
        """Where the table at ``sink`` keeps the records of its batches that did not decode: a
        table of the same format beside it, ``<sink>_errors``."""
        return sink.rstrip("/") + "_errors"

    @abc.abstractmethod
    def committed(self, spark: Any, sink: str, *, pipeline: str, batch_id: int) -> BatchCommit | None:
        """What batch ``batch_id`` of ``pipeline`` last committed in ``sink``, or None."""

    def is_committed(
        self, spark: Any, sink: str, *, pipeline: str, batch_id: int, attempt: int | None = None
    ) -> bool:
        """Whether the batch is committed (by ``attempt``, if given)."""
        commit = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
        return commit is not None and (attempt is None or commit.attempt == attempt)

    def begin(self, spark: Any, spec: JobSpec, source: BatchSource) -> BatchWrite:
        return TableWrite(self, spark, spec, source)

    def adopt(self, spark: Any, spec: JobSpec) -> tuple[CommittedBatch | None, list[str]]:
        """See :meth:`SinkFormat.adopt`: the batch's newest commit (module doc, step 1)."""
        plan, adopt = spec.plan, spec.adopt
        assert adopt is not None
        commit = self.committed(spark, plan.sink, pipeline=plan.pipeline, batch_id=plan.batch_id)
        if commit is None:
            return None, ["no committed version"]
        accepted = [sorted(adopt.ranges)] + (
            [sorted(plan.ranges)] if any(r.count > 0 for r in plan.ranges) else []
        )
        if sorted(commit.ranges) not in accepted:
            return None, [
                f"ranges {', '.join(map(str, sorted(commit.ranges))) or 'none'} differ from the plan"
            ]
        problem = commit.count_problem()
        if problem is not None:  # a commit the writer's own check refused stays in the table
            return None, [
                f"the commit of attempt {commit.attempt} (table version {commit.version}) is not the batch's output: {problem}"
            ]
        log.info(
            "Batch %s: adopting the %s commit of attempt %s (table version %s; no re-read)",
            plan.batch_id,
            self.name,
            commit.attempt,
            commit.version,
        )
        return commit.reported(), []


class TableWrite(BatchWrite):
    """One batch into a :class:`TableFormat` (module doc, steps 2 and 3)."""

    def __init__(self, fmt: TableFormat, spark: Any, spec: JobSpec, source: BatchSource) -> None:
        plan = spec.plan
        self.fmt, self.spark, self.spec, self.source = fmt, spark, spec, source
        self.where = (
            f"batch {plan.batch_id} of pipeline {plan.pipeline!r} into {fmt.name} table {plan.sink!r}"
        )
        self.reads = any(r.count > 0 for r in plan.ranges)
        self.per_partition: list[Any] = []
        self.kept: list[Any] = []  # persisted DataFrames, released by close()

    def counted(self, read: Any) -> Any:
        if self.reads:  # Kafka is read once: counted and written from the same data
            read = read.persist()
            self.kept.append(read)
        self.per_partition = read.groupBy("topic", "partition").count().collect()
        return read

    def commit(
        self,
        rows: Any,
        *,
        write_files: Callable[[str], int | None] | None = None,
        set_aside: SetAside | None = None,
    ) -> CommittedBatch:
        if write_files is not None:
            raise SinkFormatError(
                f"{self.where}: the {self.fmt.name} format takes no files the arrow writer wrote"
            )
        spec, plan = self.spec, self.spec.plan
        if set_aside is not None:  # counted and checked before anything is committed
            set_aside.settle()
            self.per_partition = [
                {"topic": r.topic, "partition": r.partition, "count": n} for r, n, _ in set_aside.reads if n
            ]
        read = sum(int(r["count"]) for r in self.per_partition)
        if spec.transform is None:
            expected = read if set_aside is None else set_aside.good
        else:
            # the transform's rows, computed once: counted and written from the same data (a
            # transform with side effects runs once, a non-deterministic one is counted as written)
            rows = rows.persist()
            self.kept.append(rows)
            expected = rows.count()
        details = {
            "partitions": [
                {"topic": r["topic"], "partition": int(r["partition"]), "records": int(r["count"])}
                for r in self.per_partition
            ],
            "reader": self.source.reader,
            "transform": spec.transform,
            "records_read": read,
            "executors": _executors(self.spark) if read else 0,
        }
        attempt = spec.attempt or 1
        if set_aside is not None:
            details["bad_records"] = set_aside.count
            # the error table first: the batch's commit below is what marks it done, so a failure
            # between the two leaves a batch a replay rewrites whole (its newer attempt replaces the
            # error table's rows of the batch too: none repeated, none lost). A first attempt with
            # nothing to set aside writes no error table.
            if set_aside.count or attempt > 1:
                self.fmt.write_batch(
                    self.spark,
                    set_aside.errors(),
                    self.fmt.error_table(plan.sink),
                    pipeline=plan.pipeline,
                    batch_id=plan.batch_id,
                    attempt=attempt,
                    ranges=plan.ranges,
                    expected_records=set_aside.count,
                    details={"error_table_of": plan.sink},
                )
        partition = PartitionBy.parse(spec.options.get("partition_by"))
        commit = self.fmt.write_batch(
            self.spark,
            rows,
            plan.sink,
            pipeline=plan.pipeline,
            batch_id=plan.batch_id,
            attempt=attempt,
            ranges=plan.ranges,
            expected_records=expected,
            details=details,
            merge_schema=set_aside is not None,
            # only when set: a format written before partitioning existed takes no such argument
            **({"partition_by": partition} if partition is not None else {}),
        )
        return commit.reported()

    def failure(self, error: Exception, cause: str) -> str:
        if isinstance(error, SinkFormatError):
            return f"{self.where}: {error}"
        return (
            f"{self.where} failed while reading {ranges_read(self.spec.plan.ranges)} "
            f"(reader={self.source.reader}) or committing: {type(error).__name__}: {cause}"
        )

    def close(self) -> None:
        for df in reversed(self.kept):  # the transform's rows, then the read
            df.unpersist()
        self.kept = []


def _executors(spark: Any) -> int:
    """Executors of a classic session (the driver excluded; local mode counts as one); 1 where the
    session does not say (Spark Connect)."""
    try:
        status = spark.sparkContext.statusTracker()
        return max(len(status.getExecutorInfos()) - 1, 1)
    except Exception:  # a Connect session has no SparkContext
        return 1
