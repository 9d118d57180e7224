"""``parquet``, the default sink format: a directory of ``batch_id=<N>`` Parquet directories, each
written into a staging directory and swapped in whole (:mod:`.write`, :mod:`.commit`), fenced by the
ledger's attempt number (:mod:`.fencing`).

What the batch job's write does (:class:`ParquetWrite`): Spark's Parquet writer writes the
transformed rows into the attempt's staging directory, or the arrow writer's tasks write the files
they read themselves; the commit counts the records *read* per partition, from the completion
records the reader left in the staging directory (:attr:`ParquetWrite.read_records_dir`), or, for a
reader that leaves none and no transform, from Spark's own counts as it writes
(``DataFrame.observe``); ranges counted by neither are counted by the job with a second read. A batch
with nothing to read and no transform runs no Spark job: the commit writes one schema-only file.

A replay adopts the committed version when its manifest is complete (:func:`.fencing.adoption_problems`,
every listed file present at its listed size), read where Spark runs (:mod:`.manifest`).

Nothing here imports pyspark at import time: the Airflow side asks the format its questions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec, OffsetRange, TopicPartition, batch_path

from ..base import BatchSource, BatchWrite, CommittedBatch, SetAside, SinkFormat, SinkFormatError, ranges_read

log = logging.getLogger(__name__)


def reported(manifest: dict[str, Any]) -> CommittedBatch:
    """What the job reports of a committed batch, from its manifest."""
    counts = {
        TopicPartition(p["topic"], int(p["partition"])): int(p["records"]) for p in manifest["partitions"]
    }
    return CommittedBatch(
        ranges=tuple(OffsetRange.from_dict(r) for r in manifest["ranges"]),
        partitions=counts,
        records=sum(counts.values()),
        bytes=int(manifest["bytes"]),
        executors=int(manifest["executors"]),
        unread=tuple(OffsetRange.from_dict(r) for r in manifest.get("unread", ())),
        read_by=manifest.get("reader"),
        bad_records=int(manifest.get("bad_records") or 0),
    )


class ParquetSink(SinkFormat):
    name: ClassVar[str] = "parquet"
    summary: ClassVar[str] = "a directory of batch_id=<N> Parquet directories, swapped in whole"
    notes: ClassVar[str] = "local disk or HDFS"
    needs_directory_renames: ClassVar[bool] = True
    takes_arrow_writer: ClassVar[bool] = True
    stages_before_commit: ClassVar[bool] = True

    def event_path(self, sink: str, batch_id: int) -> str:
        """The batch's own directory."""
        return batch_path(sink, batch_id)

    def batch_dataset(
        self, path: str, *, pipeline: str, batch_id: int, read_at: Mapping[str, Any] | None = None
    ) -> Any:
        """The batch's directory, every file of it (it never changes: ``read_at`` is not needed)."""
        import pyarrow.dataset as ds

        return ds.dataset(path, format="parquet")

    def begin(self, spark: Any, spec: JobSpec, source: BatchSource) -> BatchWrite:
        return ParquetWrite(spark, spec, source)

    def adopt(self, spark: Any, spec: JobSpec) -> tuple[CommittedBatch | None, list[str]]:
        """See :meth:`SinkFormat.adopt`: the committed manifest, if it is a complete output for the
        planned ranges, or for the ranges this run would write (:func:`.fencing.adoption_problems`)."""
        from .fencing import adoption_problems
        from .write import committed_manifest, register  # defers pyspark

        plan, adopt = spec.plan, spec.adopt
        assert adopt is not None
        register(spark)
        manifest = committed_manifest(spark, plan.sink, plan.batch_id, verify=True)
        accepted = [adopt.ranges] + ([plan.ranges] if any(r.count > 0 for r in plan.ranges) else [])
        problems = adoption_problems(manifest, plan.pipeline, *accepted)
        problems += (manifest or {}).get("file_problems", [])
        if problems:
            log.info("Batch %s: not adopting the committed version (%s)", plan.batch_id, "; ".join(problems))
            return None, problems
        assert manifest is not None
        log.info(
            "Batch %s: adopting the version attempt %s committed (no re-read; the last owner was %s)",
            plan.batch_id,
            str(manifest.get("token"))[:8],
            adopt.token[:8] or "none",
        )
        return reported(manifest), []


class ParquetWrite(BatchWrite):
    """One attempt's write of a batch into the Parquet directory (module doc)."""

    def __init__(self, spark: Any, spec: JobSpec, source: BatchSource) -> None:
        from .commit import read_records_dir

        plan = spec.plan
        self.spark, self.spec, self.source = spark, spec, source
        self.read_records_dir = read_records_dir(plan.sink, plan.batch_id, spec.token)
        self.describe = {
            "pipeline": plan.pipeline,
            "run_id": plan.run_id,
            "reader": source.reader,
            "transform": spec.transform,
            "writer": source.writer,
        }

    def commit(
        self,
        rows: Any,
        *,
        write_files: Callable[[str], int | None] | None = None,
        set_aside: SetAside | None = None,
    ) -> CommittedBatch:
        from .write import write_batch  # defers pyspark

        spec, plan = self.spec, self.spec.plan
        if not any(r.count > 0 for r in plan.ranges) and spec.transform is None and set_aside is None:
            # nothing to read: no Spark job (whichever writer), the commit writes the schema-only
            # file (executors 0)
            write_files = lambda staging: 0  # noqa: E731
        manifest = write_batch(
            self.spark,
            rows,
            plan.sink,
            plan.batch_id,
            plan.ranges,
            self.describe,
            token=spec.token,
            compression=spec.options.get("parquet_compression"),
            attempt=spec.attempt,
            plain_columns=spec.options.get("parquet_plain_columns"),
            write_data=write_files,
            # a reader that leaves no completion records: the write counts what it reads
            count_reads=not self.source.leaves_completion_records
            and spec.transform is None
            and set_aside is None,
            set_aside=set_aside,
        )
        return reported(manifest)

    def failure(self, error: Exception, cause: str) -> str:
        if isinstance(error, SinkFormatError):  # the sink's own refusal names the batch
            return str(error)
        plan = self.spec.plan
        return (
            f"batch {plan.batch_id} of pipeline {plan.pipeline!r} failed while reading {ranges_read(plan.ranges)} "
            f"(reader={self.source.reader}) or writing {plan.output_path!r}: {cause}"
        )
