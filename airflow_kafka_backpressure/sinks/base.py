"""The :class:`SinkFormat` interface: every question the code asks of a pipeline's ``sink_format``,
and the write of one batch (:class:`BatchWrite`) that the batch job drives."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec, OffsetRange, TopicPartition


class SinkFormatError(RuntimeError):
    """A batch could not be committed, or what the sink holds is not what was asked for."""


class SinkFenced(SinkFormatError):
    """A newer attempt of the batch has committed: this (older) attempt's write was refused."""


class UnknownSinkFormat(ValueError):
    pass


def ranges_read(ranges: Sequence[OffsetRange]) -> str:
    """The non-empty ``ranges`` of a batch, for messages (``nothing`` if none)."""
    return ", ".join(str(r) for r in ranges if r.count > 0) or "nothing"


@dataclass(frozen=True)
class BatchSource:
    """How the batch job reads the batch a write commits: the reader's name, whether the reader
    leaves a completion record per input partition read to its end (in the write's
    :attr:`BatchWrite.read_records_dir`), and the writer (``spark``: the job hands the rows to
    :meth:`BatchWrite.commit`; ``arrow``: the reading tasks write the files themselves)."""

    reader: str
    leaves_completion_records: bool
    writer: str


@dataclass(frozen=True)
class CommittedBatch:
    """What the job reports of a batch a format committed, or holds from an earlier attempt (an
    adoption): the ranges as committed (their partitions are the metrics'), the records read per
    topic-partition of the ranges it counted and their total, the bytes and executors it says,
    and the ranges it did not count (``unread``: the job counts them with a second read, by the
    reader called ``read_by``; None: a commit that names no reader)."""

    ranges: tuple[OffsetRange, ...]
    partitions: Mapping[TopicPartition, int]
    records: int
    bytes: int
    executors: int
    unread: tuple[OffsetRange, ...] = ()
    read_by: str | None = None
    #: records read that did not decode, committed to the error table with the batch
    bad_records: int = 0
    #: what a reader needs to read the sink as this commit left it (a table's version), or None
    read_at: Mapping[str, Any] | None = None


class SetAside(abc.ABC):
    """What decoding made of a batch (the job's :mod:`~..spark.decoding`), for the write to commit
    with the batch's rows. :attr:`rows` are the records that decoded, in the columns that land;
    the records that did not are the error table's (:meth:`errors`), committed in the same commit.

    :meth:`settle` counts the batch and checks it (an incompatible schema, more bad records than
    the pipeline's bound: it raises, and nothing may be committed); :attr:`count`, :attr:`good` and
    :attr:`reads` hold after it. When :attr:`observed`, writing :attr:`rows` counts them as they
    pass, so a format whose data write comes before its commit settles between the two with no
    second pass; otherwise :meth:`settle` runs a Spark job of its own, before the write."""

    rows: Any
    #: writing :attr:`rows` (untransformed) counts the batch: settle after that write
    observed: bool = False
    #: records that did not decode; records that did; (range, records read, key+value bytes)
    count: int = 0
    good: int = 0
    reads: tuple[tuple[OffsetRange, int, int], ...] = ()

    @abc.abstractmethod
    def settle(self) -> None:
        """Count the batch and check it (see the class doc); raises with the job's message."""

    @abc.abstractmethod
    def errors(self) -> Any:
        """The records that did not decode, as the error table holds them (a DataFrame)."""


class BatchWrite(abc.ABC):
    """One attempt's write of one batch into a format, driven by the batch job in this order: the
    job reads the batch's ranges (a reader that leaves completion records leaves them in
    :attr:`read_records_dir`), passes what it read through :meth:`counted`, applies the pipeline's
    transform and hands the rows to :meth:`commit`; :meth:`close` always follows."""

    #: where a reader that leaves completion records leaves them (None: the write counts itself)
    read_records_dir: str | None = None

    def counted(self, read: Any) -> Any:
        """The batch's records as read (a DataFrame, before the transform), as the write counts
        them; the job transforms what this returns. Default: as they are."""
        return read

    @abc.abstractmethod
    def commit(
        self,
        rows: Any,
        *,
        write_files: Callable[[str], int | None] | None = None,
        set_aside: SetAside | None = None,
    ) -> CommittedBatch:
        """Commit ``rows`` (the transformed DataFrame) as the batch, once (fenced by the spec's
        attempt, checked against the rows that must land), and say what was committed.
        ``write_files``: the arrow writer (only for a format that :attr:`~SinkFormat.takes_arrow_writer`)
        writes the batch's files into the staging directory it is given and returns the rows it
        wrote; ``rows`` then gives the schema only. ``set_aside``: the batch was decoded: its bad
        records go to the format's error table in the same commit (a replay neither loses nor
        repeats them), and its ``reads`` are the counts of what was read."""

    @abc.abstractmethod
    def failure(self, error: Exception, cause: str) -> str:
        """The job's message for ``error``, which broke the read or the commit: a
        :class:`SinkFormatError` in the format's words, any other with ``cause`` (the useful line of
        a Spark error), naming the batch and where it was going."""

    def close(self) -> None:  # noqa: B027 - a write that keeps nothing has nothing to release
        """Release what the write kept (persisted data), after the commit or its failure."""


class SinkFormat(abc.ABC):
    """How a batch lands in a sink, and what the pipeline asks of it. ``sink`` is the sink's
    location (a path or URI Spark's writer takes: a local path, ``s3a://bucket/prefix``, …).

    Every format commits a batch whole and once: a retry of a committed attempt changes nothing, a
    newer attempt replaces the batch (never appends beside it), an older attempt after a newer one
    is refused, a replay of an old batch after newer ones lands. Its commit records the batch's
    pipeline, id, attempt and ranges, so that a replay can adopt it (:meth:`adopt`).

    The attributes and :meth:`commit_lock_reason`, :meth:`event_path` and :meth:`batch_dataset` are
    asked on the Airflow side (no Spark session: a format's module imports no pyspark at its top);
    :meth:`begin` and :meth:`adopt` in the batch job, with its Spark session.
    """

    name: ClassVar[str]
    #: what it is, for the configuration reference and messages ("a Delta Lake table, …")
    summary: ClassVar[str] = ""
    #: where it works and what it needs, for the configuration reference
    notes: ClassVar[str] = ""
    #: its commit renames directories, which object stores cannot do: a sink on one is refused
    #: before anything is planned (:func:`~..sink_placement.sink_refusal`)
    needs_directory_renames: ClassVar[bool] = False
    #: the arrow writer (each Python reader task writes its range's Parquet files) can feed it
    takes_arrow_writer: ClassVar[bool] = False
    #: its data write is staged and published by a commit of its own: a decoded batch is counted
    #: and checked between the two, as its rows are written (:attr:`SetAside.observed`)
    stages_before_commit: ClassVar[bool] = False
    #: it partitions a table by event time (``sink_options.partition_by``)
    partitions: ClassVar[bool] = False
    #: a pipeline may give it a ``maintenance`` (the DAG ``kbp_maintain_<name>``: :meth:`maintain`)
    maintainable: ClassVar[bool] = False

    @classmethod
    def configured(cls, options: Mapping[str, Any]) -> SinkFormat:
        """The format for a pipeline's ``sink_options`` (their job options: the keys set). Default:
        a format that takes none of them."""
        return cls()

    @classmethod
    def options_problem(cls, options: Mapping[str, Any]) -> tuple[str, Any, str] | None:
        """The ``sink_options`` key this format cannot work with, its value as a message may show
        it (no secret) and why (None: none), checked when the pipelines file is read. Default:
        ``partition_by`` where the format does not :attr:`partitions`."""
        if options.get("partition_by") and not cls.partitions:
            return (
                "partition_by",
                options["partition_by"],
                f"sink_format {cls.name!r} partitions nothing by event time: use a table format "
                "(delta or iceberg), or leave partition_by out",
            )
        return None

    @classmethod
    def reference(cls) -> str:
        """The format in the configuration reference: its name, what it is, where it works."""
        text = "; ".join(part for part in (cls.summary, cls.notes) if part)
        return f"{cls.name} ({text})" if text else cls.name

    def writer_problem(self, writer: str) -> str | None:
        """Why the pipeline's ``sink_options.writer`` cannot write into this format (None: it can):
        the arrow writer writes Parquet files, which only a format that :attr:`takes_arrow_writer`
        commits."""
        if writer == "arrow" and not self.takes_arrow_writer:
            return (
                f"writer 'arrow' writes Parquet files itself; sink_format {self.name!r} commits through "
                "Spark's writer: use writer 'auto' or 'spark'"
            )
        return None

    def commit_lock_reason(self, sink: str, spark_conf: Mapping[str, str]) -> str | None:
        """Why two Spark drivers committing batches into ``sink`` at the same time could lose a
        commit, so that the pipeline must run one batch's job at a time there (the ledger's lock of
        the table, :func:`~.commit_lock.commit_lock_name`); None when the format's commit is safe
        among any number of drivers. ``spark_conf``: the pipeline's Spark settings, which may choose
        the store's commit protocol. Called on the Airflow worker: no Spark session. Default None."""
        return None

    def event_path(self, sink: str, batch_id: int) -> str:
        """The path a committed batch's Asset event names (``output_path``): where a downstream task
        finds the batch. Default: the sink itself (a table holding every batch)."""
        return sink

    def batch_dataset(
        self, path: str, *, pipeline: str, batch_id: int, read_at: Mapping[str, Any] | None = None
    ) -> Any:
        """The rows of batch ``batch_id`` of ``pipeline``, whose Asset event named ``path``
        (:meth:`event_path`), as a ``pyarrow.dataset.Dataset``, read without Spark (a downstream
        task); ``read_at``: the table as the batch's commit left it (the event's ``read_at``), where
        the format records one. Default: refused, the format gives no such reader."""
        raise ValueError(
            f"batch {batch_id}: sink_format {self.name!r} has no reader here: read {path} with Spark"
        )

    def maintain(self, sink: str, options: Any) -> Any:
        """Compact the table at ``sink``, expire its old snapshots and delete the files nothing
        references (``options``: the pipeline's ``MaintenanceOptions``), and return a
        :class:`~.maintenance.MaintenanceReport`. Runs on the Airflow worker, no Spark session, under
        the ledger's lock of the table. Default: refused, the format has no table to maintain."""
        raise SinkFormatError(
            f"sink_format {self.name!r} has no table to maintain (each batch is its own directory): "
            f"remove the pipeline's maintenance, or use a table format"
        )

    @abc.abstractmethod
    def begin(self, spark: Any, spec: JobSpec, source: BatchSource) -> BatchWrite:
        """The write of ``spec``'s batch (this attempt), read as ``source`` says."""

    @abc.abstractmethod
    def adopt(self, spark: Any, spec: JobSpec) -> tuple[CommittedBatch | None, list[str]]:
        """A replay's adoption (``spec.adopt``): what the sink holds for the batch, if it is the
        batch's complete output for its planned ranges or for ``spec.adopt.ranges`` (whichever
        attempt wrote it), taken over without reading Kafka; else None and why not."""
