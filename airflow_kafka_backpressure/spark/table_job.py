"""One batch into a table-format sink (``sink_format`` one of :data:`~..sinks.SINK_FORMATS`: Delta).

What :func:`~.job.run_batch` does for a Parquet directory, for a table format:

1. **adopt** (a replay of a batch whose earlier attempt may have committed): the sink's newest
   commit of the batch (:meth:`~..sinks.SinkFormat.committed`), if it holds the planned ranges (or
   those this run would write) and the rows recorded with it as the batch's to publish (a commit
   its writer's row check refused stays in the table, and is not adopted), is taken over without
   reading Kafka, whichever attempt wrote it;
2. **bounds** checked against the brokers, as for every batch;
3. **read** the ranges (Spark's reader or the Python one), persisted so that Kafka is read once:
   the per-partition counts and the rows written come from the same data;
4. **transform**, then **commit** it as one transaction of the format, fenced by the ledger's
   attempt number and checked against the rows that must land (the records read, or what the
   transform returned): another count fails the batch (no empty or partial success). The
   transform's output is persisted, then counted and written from the same data: the transform runs
   once per batch.

The per-partition counts go into the commit (``details``), so adoption gives the controller the
same metrics as the run that wrote it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_kafka_backpressure.models import BatchMetrics, JobSpec, PartitionCount, TopicPartition
from airflow_kafka_backpressure.sinks import BatchCommit, SinkFormatError, sink_format_for
from airflow_kafka_backpressure.spark.bounds import check_bounds
from airflow_kafka_backpressure.spark.errors import JobError
from airflow_kafka_backpressure.spark.job import _now_ms, _spark_failure, apply_transform

log = logging.getLogger(__name__)


def _metrics(spec: JobSpec, commit: BatchCommit, read_started_at_ms: int, *, adopted: bool) -> BatchMetrics:
    counts = {
        TopicPartition(str(c["topic"]), int(c["partition"])): int(c["records"])
        for c in commit.details.get("partitions", ())
    }
    return BatchMetrics(
        batch_id=spec.plan.batch_id,
        records=sum(counts.values()) if counts else commit.record_count,
        bytes=int(commit.bytes or 0),
        launched_at_ms=spec.launched_at_ms,
        read_started_at_ms=read_started_at_ms,
        committed_at_ms=_now_ms(),
        executors=int(commit.details.get("executors", 1 if commit.record_count else 0)),
        partitions=tuple(PartitionCount(r.topic, r.partition, counts.get(r.tp, 0)) for r in commit.ranges),
        adopted=adopted,
    )


def adopt_table_commit(spark: Any, spec: JobSpec) -> tuple[BatchMetrics | None, list[str]]:
    """The metrics of the batch's newest commit if ``spec.adopt`` accepts its ranges, else None and why."""
    plan, adopt = spec.plan, spec.adopt
    assert adopt is not None
    started = _now_ms()
    commit = sink_format_for(spec.sink_format).committed(
        spark, plan.sink, pipeline=plan.pipeline, batch_id=plan.batch_id
    )
    if commit is None:
        return None, ["no committed version"]
    accepted = [sorted(adopt.ranges)] + (
        [sorted(plan.ranges)] if any(r.count > 0 for r in plan.ranges) else []
    )
    if sorted(commit.ranges) not in accepted:
        return None, [f"ranges {', '.join(map(str, sorted(commit.ranges))) or 'none'} differ from the plan"]
    problem = commit.count_problem()
    if problem is not None:  # a commit the writer's own check refused stays in the table
        return None, [
            f"the commit of attempt {commit.attempt} (table version {commit.version}) is not the batch's output: {problem}"
        ]
    log.info(
        "Batch %s: adopting the %s commit of attempt %s (table version %s; no re-read)",
        plan.batch_id,
        spec.sink_format,
        commit.attempt,
        commit.version,
    )
    return _metrics(spec, commit, started, adopted=True), []


def run_table_batch(spark: Any, spec: JobSpec) -> BatchMetrics:
    """Run one batch into the table-format sink ``spec.sink_format`` (see the module doc)."""
    from airflow_kafka_backpressure.spark.kafka_range_source import KAFKA_SCHEMA  # defers pyspark
    from airflow_kafka_backpressure.spark.readers import choose_reader, read_ranges

    plan = spec.plan
    fmt = sink_format_for(spec.sink_format)
    if spec.adopt is not None:
        adopted, problems = adopt_table_commit(spark, spec)
        if adopted is not None:
            return adopted
        if spec.adopt.refusal:
            raise JobError(
                f"{spec.adopt.refusal} (no committed version of the batch to adopt: {'; '.join(problems)})"
            )
    check_bounds(spec)
    reader = choose_reader(spark, spec)
    read_started_at_ms = _now_ms()
    where = f"batch {plan.batch_id} of pipeline {plan.pipeline!r} into {spec.sink_format} table {plan.sink!r}"
    reads = any(r.count > 0 for r in plan.ranges)
    if reads:
        raw = read_ranges(spark, spec, reader).persist()
    else:
        raw = spark.createDataFrame([], KAFKA_SCHEMA)
    transformed = None
    try:
        try:
            per_partition = raw.groupBy("topic", "partition").count().collect()
            out = apply_transform(raw, spec.transform)
            read = sum(int(r["count"]) for r in per_partition)
            if spec.transform is None:
                expected = read
            else:
                # the transform's rows, computed once: counted and written from the same data (a
                # transform with side effects runs once, a non-deterministic one is counted as written)
                transformed = out = out.persist()
                expected = out.count()
            details = {
                "partitions": [
                    {"topic": r["topic"], "partition": int(r["partition"]), "records": int(r["count"])}
                    for r in per_partition
                ],
                "reader": reader.name,
                "transform": spec.transform,
                "records_read": read,
                "executors": _executors(spark) if read else 0,
            }
            commit = fmt.write_batch(
                spark,
                out,
                plan.sink,
                pipeline=plan.pipeline,
                batch_id=plan.batch_id,
                attempt=spec.attempt or 1,
                ranges=plan.ranges,
                expected_records=expected,
                details=details,
            )
        finally:
            if transformed is not None:
                transformed.unpersist()
            if reads:
                raw.unpersist()
    except SinkFormatError as e:
        raise JobError(f"{where}: {e}") from e
    except JobError:
        raise
    except Exception as e:
        raise JobError(
            f"{where} failed while reading {', '.join(str(r) for r in plan.ranges if r.count > 0) or 'nothing'} "
            f"(reader={reader.name}) or committing: {type(e).__name__}: {_spark_failure(e)}"
        ) from e
    return _metrics(spec, commit, read_started_at_ms, adopted=False)


def _executors(spark: Any) -> int:
    """Executors of a classic session (the driver excluded; local mode counts as one); 1 where the
    session does not say (Spark Connect)."""
    try:
        status = spark.sparkContext.statusTracker()
        return max(len(status.getExecutorInfos()) - 1, 1)
    except Exception:  # a Connect session has no SparkContext
        return 1
