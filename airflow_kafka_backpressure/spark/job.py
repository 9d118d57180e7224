"""The bounded batch: read one batch's exact Kafka offset ranges, transform, commit them in the sink.

:func:`run_batch` is the batch logic, given a Spark session: a classic one (the submit engine runs
this module as the driver program through ``spark-submit``) or a Spark Connect session (the connect
engine calls it through a client session). One path for every sink format (``spec.sink_format``,
one of :data:`~airflow_kafka_backpressure.sinks.SINK_FORMATS`):

0. a replay that may adopt (``spec.adopt``): the format's adoption (:meth:`~..sinks.SinkFormat.adopt`)
   takes over the batch's committed output without reading Kafka, if it is complete;
1. check every range against the partition's earliest/latest offsets, before anything is read
   (:mod:`.bounds`): a missing topic or partition, a range past the latest offset or below the
   earliest one, or an unreachable broker is a :class:`JobError` saying what to do;
2. read the ranges (:mod:`.readers`: the reader the spec names, or for ``auto`` the first that can
   read the batch), leaving completion records where the format's write asks for them;
3. apply the optional user transform ``"package.module:function"`` (DataFrame -> DataFrame);
4. commit it by the format's write (:meth:`~..sinks.SinkFormat.begin`: the Parquet directory's
   staging directory and swap, a Delta transaction, …) — or, with the ``arrow`` writer (a format
   that :attr:`~..sinks.SinkFormat.takes_arrow_writer`), the reading tasks write the files;
5. return :class:`~airflow_kafka_backpressure.batch.models.BatchMetrics` from what the format committed.

Metrics: ``records``/``bytes`` and per-partition counts are of the records read, as the format
counted them (the Python reader's completion records, Spark's own counts as it writes, a persisted
read counted per partition); ranges the format did not count (read under a transform that may not
have consumed them) are counted with a second read. ``executors`` is the number of distinct
executors that read the batch's ranges (1 in local mode).

As a program (``spark-submit job.py --spec <URI>``) it reads the spec from the submit engine's
hand-off directory (:mod:`airflow_kafka_backpressure.batch.handoff`), deletes it, runs the batch and leaves
``metrics.json`` or ``error.json`` next to it; it also prints ``KBP_ERROR <message>`` on stderr and
exits 1 on failure (2 for an unreadable spec). This module never imports Airflow and launches
nothing: the executors import ``airflow_kafka_backpressure`` from the zip the engine ships.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from airflow_kafka_backpressure.batch import handoff
from airflow_kafka_backpressure.batch.models import (
    DEFAULT_WRITER,
    BatchMetrics,
    JobSpec,
    OffsetRange,
    PartitionCount,
    TopicPartition,
    chosen_writer,
    writer_problem,
)
from airflow_kafka_backpressure.sinks import (
    BatchSource,
    CommittedBatch,
    SinkFormat,
    UnknownSinkFormat,
    sink_format_for,
)
from airflow_kafka_backpressure.sinks.completion import key_value_bytes
from airflow_kafka_backpressure.spark.bounds import check_bounds, range_problems
from airflow_kafka_backpressure.spark.decoding import decode_batch
from airflow_kafka_backpressure.spark.errors import JobError
from airflow_kafka_backpressure.spark.launcher_watch import (
    LauncherWatch,
    remove_attempt_files,
    watch_launcher,
)
from airflow_kafka_backpressure.spark.python_reader import PythonReader
from airflow_kafka_backpressure.spark.readers import (
    NATIVE_PROVIDER_CLASS,
    READERS,
    Reader,
    choose_reader,
    feeds_arrow_writer,
    native_options,
    native_reader_available,
    read_ranges,
    reader_for,
    reader_settings,
)
from airflow_kafka_backpressure.spark.session_secrets import plan_properties
from airflow_kafka_backpressure.storage import Location, StorageError, location

log = logging.getLogger("airflow_kafka_backpressure.spark.job")

__all__ = [
    "NATIVE_PROVIDER_CLASS",
    "JobError",
    "adopt_committed",
    "batch_metrics",
    "check_bounds",
    "arrow_writer_reader",
    "choose_reader",
    "main",
    "native_options",
    "native_reader_available",
    "range_problems",
    "read_ranges",
    "reader_settings",
    "run_batch",
]

METRICS_PREFIX = "KBP_METRICS "
ERROR_PREFIX = "KBP_ERROR "
# --------------------------------------------------------------------------- transform


def load_transform(ref: str) -> Callable[[Any], Any]:
    """The function named by ``"package.module:function"``."""
    module_name, _, attr_path = ref.partition(":")
    if not module_name or not attr_path:
        raise JobError(f"transform {ref!r} must look like 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:
        raise JobError(
            f"transform {ref!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}). "
            "Install it where the driver runs, or ship it with --py-files"
        ) from e
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise JobError(f"transform {ref!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise JobError(f"transform {ref!r} is a {type(obj).__name__}, not a function")
    return obj


def apply_transform(df: Any, ref: str | None) -> Any:
    """``df`` passed through the transform ``ref`` (unchanged when None)."""
    if ref is None:
        return df
    from pyspark.sql import DataFrame

    fn = load_transform(ref)
    try:
        out = fn(df)
    except Exception as e:
        raise JobError(f"transform {ref!r} raised {type(e).__name__}: {e}") from e
    if not isinstance(out, DataFrame):
        raise JobError(
            f"transform {ref!r} returned {type(out).__name__}, not a DataFrame; it must take the "
            "batch's DataFrame and return a pyspark.sql.DataFrame"
        )
    return out


# --------------------------------------------------------------------------- counting


def count_unread(
    spark: Any, spec: JobSpec, reader: Reader, unread: Sequence[OffsetRange]
) -> tuple[dict[TopicPartition, int], int]:
    """Records and key+value bytes of ``unread`` ranges, by a second read (the transform did not
    consume them, or the native reader, which leaves no completion records, read them)."""
    from pyspark.sql import functions as F

    if not unread:
        return {}, 0
    log.warning(
        "counting %s with a second read: the write did not read them to their end",
        ", ".join(map(str, unread)),
    )
    sub = JobSpec.from_dict(
        {**spec.to_dict(), "plan": {**spec.plan.to_dict(), "ranges": [r.to_dict() for r in unread]}}
    )
    size = key_value_bytes()
    rows = (
        read_ranges(spark, sub, reader)
        .groupBy("topic", "partition")
        .agg(F.count(F.lit(1)).alias("n"), F.expr(f"sum({size}) AS b"))
        .collect()
    )
    counts = {TopicPartition(r["topic"], int(r["partition"])): (int(r["n"]), int(r["b"] or 0)) for r in rows}
    return {r.tp: counts.get(r.tp, (0, 0))[0] for r in unread}, sum(b for _, b in counts.values())


# --------------------------------------------------------------------------- the batch


def _now_ms() -> int:
    return int(time.time() * 1000)


#: Where the cause of a failed batch shows in a Spark error, most specific first: the Python
#: reader's and the sink's own errors (their message alone), then what Spark's Kafka reader throws
#: (a fetch that got nothing within the poll timeout, offsets gone, the client's own errors).
_FAILURE_MARKERS = ("KafkaRangeReadError:", "SinkError:", "StorageError:")
_KAFKA_FAILURE_MARKERS = (
    "java.util.concurrent.TimeoutException:",
    "org.apache.kafka.clients.consumer.OffsetOutOfRangeException:",
    "org.apache.kafka.common.KafkaException:",
    "org.apache.kafka.common.errors.",
)


def _spark_failure(e: Exception) -> str:
    """The useful line of a Spark error (an executor's KafkaRangeReadError or SinkError, or the
    exception of Spark's Kafka reader, if any)."""
    lines = str(e).strip().splitlines()
    for marker in _FAILURE_MARKERS:
        for line in lines:
            if marker in line:
                return line.split(marker, 1)[1].strip()
    for marker in _KAFKA_FAILURE_MARKERS:
        for line in lines:
            if marker in line:
                return line[line.index(marker) :].strip()
    if lines and lines[0].startswith("An error occurred while calling"):
        # py4j's wrapper of a JVM exception that pyspark does not convert (Delta's, say): the
        # exception is on the next line, ": <class>: <message>"
        for line in lines[1:]:
            if line.startswith(": "):
                return line[2:].strip()
    return lines[0] if lines else type(e).__name__


def arrow_codec(compression: str | None) -> bool:
    """Whether pyarrow writes the Parquet codec Spark calls ``compression``."""
    from airflow_kafka_backpressure.spark.arrow_writer import parquet_codec  # defers pyarrow

    try:
        parquet_codec(compression)
    except ValueError:
        return False
    return True


def arrow_writer_reader() -> Reader:
    """The reader the arrow writer's tasks read with: the first registered one that feeds it."""
    return next(kind() for kind in READERS.values() if kind.feeds_arrow_writer)


def batch_writer(spec: JobSpec, fmt: SinkFormat) -> str:
    """The spec's ``writer`` option (:mod:`.arrow_writer`), checked against its reader, transform and
    sink format; ``auto`` is resolved once the reader is known (:func:`.models.chosen_writer`)."""

    writer = str(spec.options.get("writer") or DEFAULT_WRITER)
    problem = writer_problem(
        writer,
        spec.transform,
        spec.reader,
        feeds_arrow_writer(spec.reader),
        decoded=spec.decoding is not None,
    )
    problem = problem or fmt.writer_problem(writer)
    if problem:
        raise JobError(f"writer = {writer!r} is invalid: {problem}")
    return writer


def task_slots(spark: Any, min_partitions: int | None) -> int | None:
    """How many tasks of a batch can run at once, where the session says so: in a classic session
    (this process is the driver) its ``defaultParallelism``, at least ``min_partitions`` (the
    executor target's cores, whose executors may still be registering). None over Spark Connect:
    the server's slots are not the client's to know, and with dynamic allocation pending tasks are
    what brings executors."""
    if getattr(spark, "_jvm", None) is None:
        return None
    return max(int(spark.sparkContext.defaultParallelism), min_partitions or 1)


def write_ranges_with_arrow(spark: Any, spec: JobSpec, staging: str, records_dir: str) -> int:
    """The batch's data through :func:`.arrow_writer.write_ranges`, with the spec's reader settings
    and at most one task per slot (:func:`task_slots`)."""
    from airflow_kafka_backpressure.spark.arrow_writer import write_ranges  # defers pyarrow

    return write_ranges(
        spark,
        spec.plan.ranges,
        plan_properties(spec.kafka, spec.secrets_file),
        secrets_file=spec.secrets_file,
        staging=staging,
        records_dir=records_dir,
        token=spec.token,
        compression=spec.options.get("parquet_compression"),
        plain_columns=spec.options.get("parquet_plain_columns"),
        slots=task_slots(spark, spec.min_partitions),
        **reader_settings(spec),
    )


def sink_format(spec: JobSpec) -> SinkFormat:
    """The spec's sink format, from the registry."""
    try:
        return sink_format_for(spec.sink_format, spec.options)
    except UnknownSinkFormat as e:
        raise JobError(f"batch {spec.plan.batch_id}: {e}") from None


def run_batch(spark: Any, spec: JobSpec, *, bounds: Callable[[], Any] | None = None) -> BatchMetrics:
    """Run one batch in ``spark`` (a classic session or a Spark Connect session); return its metrics.

    ``bounds``: the answer of a bounds check started earlier (:func:`~.bounds.started_check`, for a
    batch that adopts nothing), awaited where the batch checks its ranges; by default they are
    checked there.

    Raises :class:`JobError` with a message naming what failed; the sink then holds the batch's
    previous committed version, if any, and never a partial or duplicated one.
    """
    from airflow_kafka_backpressure.spark.kafka_range_source import KAFKA_SCHEMA  # defers pyspark

    fmt = sink_format(spec)
    if spec.adopt is not None:
        adopted, problems = adopt_committed(spark, spec, fmt)
        if adopted is not None:
            return adopted
        if spec.adopt.refusal:  # the batch may not be read: adopting was its one way through
            raise JobError(
                f"{spec.adopt.refusal} (no committed version of the batch to adopt: {'; '.join(problems)})"
            )
    if bounds is not None:
        bounds()
    else:
        check_bounds(spec)
    writer = batch_writer(spec, fmt)
    # the arrow writer's tasks read themselves, with a reader that feeds it
    reader = arrow_writer_reader() if writer == "arrow" else choose_reader(spark, spec)
    writer = chosen_writer(
        writer,
        spec.transform,
        reader.feeds_arrow_writer and fmt.takes_arrow_writer,
        arrow_codec(spec.options.get("parquet_compression")),
        decoded=spec.decoding is not None,
    )
    read_started_at_ms = _now_ms()
    write = fmt.begin(spark, spec, BatchSource(reader.name, reader.leaves_completion_records, writer))
    # a decoded batch is counted as it is decoded (spark.decoding): no completion records
    records_dir = (
        write.read_records_dir if reader.leaves_completion_records and spec.decoding is None else None
    )
    try:
        try:
            if writer == "arrow":  # the tasks read and write: the DataFrame only gives the sink its schema
                committed = write.commit(
                    spark.createDataFrame([], KAFKA_SCHEMA),
                    write_files=lambda staging: write_ranges_with_arrow(
                        spark, spec, staging, records_dir or ""
                    ),
                )
            else:
                read = read_ranges(spark, spec, reader, read_records_dir=records_dir)
                if spec.decoding is None:
                    read = write.counted(read)
                    committed = write.commit(apply_transform(read, spec.transform))
                else:
                    # counted as its rows are written where the format commits after its write
                    observe = fmt.stages_before_commit and spec.transform is None
                    with decode_batch(spark, spec, read, observe=observe) as decoded:
                        rows = apply_transform(decoded.rows, spec.transform)
                        committed = write.commit(rows, set_aside=decoded)
        finally:
            write.close()
    except JobError:
        raise
    except Exception as e:
        raise JobError(write.failure(e, _spark_failure(e))) from e
    return batch_metrics(spark, spec, committed, read_started_at_ms, committed_at_ms=_now_ms(), reader=reader)


def adopt_committed(
    spark: Any, spec: JobSpec, fmt: SinkFormat | None = None
) -> tuple[BatchMetrics | None, list[str]]:
    """The metrics of the batch's committed output if the format's adoption accepts it
    (:meth:`~..sinks.SinkFormat.adopt`: a complete output for the planned ranges, or for the
    ranges this run would write), without reading Kafka; else None and why not (the batch is run)."""
    fmt = fmt or sink_format(spec)
    started = _now_ms()
    held, problems = fmt.adopt(spark, spec)
    if held is None:
        return None, problems
    return batch_metrics(spark, spec, held, started, adopted=True), []


def batch_metrics(
    spark: Any,
    spec: JobSpec,
    committed: CommittedBatch,
    read_started_at_ms: int,
    *,
    committed_at_ms: int | None = None,
    reader: Reader | None = None,
    adopted: bool = False,
) -> BatchMetrics:
    """The batch's metrics from what the format committed: its counts, and the ranges it did not
    count counted by a second read with ``reader`` (by default the reader the commit names;
    commits from before readers were named: python). ``committed_at_ms``: when the commit ended
    (default: now, after the second read)."""
    counts = dict(committed.partitions)
    more_bytes = 0
    if committed.unread:
        counter = reader or reader_for(committed.read_by or PythonReader.name)
        more, more_bytes = count_unread(spark, spec, counter, committed.unread)
        counts.update(more)
    return BatchMetrics(
        batch_id=spec.plan.batch_id,
        records=committed.records + sum(counts[r.tp] for r in committed.unread),
        bytes=committed.bytes + more_bytes,
        launched_at_ms=spec.launched_at_ms,
        read_started_at_ms=read_started_at_ms,
        committed_at_ms=_now_ms() if committed_at_ms is None else committed_at_ms,
        executors=committed.executors,
        partitions=tuple(PartitionCount(r.topic, r.partition, counts.get(r.tp, 0)) for r in committed.ranges),
        adopted=adopted,
        bad_records=committed.bad_records,
        read_at=None if committed.read_at is None else dict(committed.read_at),
    )


# --------------------------------------------------------------------------- command line


def _report_error(message: str) -> None:
    """One ``KBP_ERROR`` line (spark-submit merges the driver's stderr into its stdout)."""
    print(ERROR_PREFIX + " ".join(message.split()), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one bounded Kafka micro-batch on Spark.")
    parser.add_argument("--spec", required=True, help="URI of the JobSpec JSON in the hand-off directory")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        job_dir = location(args.spec).parent
    except StorageError as e:
        _report_error(str(e))
        return 2
    # the batch ends with the Airflow task process that launched it, and leaves no files behind
    watch = watch_launcher(cleanup=lambda: remove_attempt_files(job_dir))
    try:
        return _run(args.spec, job_dir, watch)
    finally:
        watch.settle()


def _run(spec_uri: str, job_dir: Location, watch: LauncherWatch) -> int:
    try:
        spec = handoff.take_spec(spec_uri, os.environ.get(handoff.SPEC_KEY_ENV))
    except (handoff.HandoffError, StorageError) as e:
        _report_error(str(e))
        return 2

    def fail(message: str) -> int:
        _report_error(message)
        try:
            watch.hand_back(lambda: handoff.write_error(job_dir, message))
        except StorageError as e:
            _report_error(f"(and the error could not be handed back: {e})")
        return 1

    if spec.adopt is None:  # a replay may adopt a committed version without reading: run_batch checks after
        try:
            check_bounds(spec)  # fail fast, before the JVM starts; run_batch checks again just before reading
        except JobError as e:
            return fail(str(e))

    from pyspark.sql import SparkSession

    plan = spec.plan
    spark = SparkSession.builder.appName(f"kbp-{plan.pipeline}-batch-{plan.batch_id}").getOrCreate()
    try:
        metrics = run_batch(spark, spec)
        watch.hand_back(lambda: handoff.write_metrics(job_dir, metrics))
        print(METRICS_PREFIX + json.dumps(metrics.to_dict(), sort_keys=True), flush=True)
        return 0
    except JobError as e:
        return fail(str(e))
    except Exception as e:
        traceback.print_exc()
        return fail(f"batch {plan.batch_id}: {type(e).__name__}: {e}")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
