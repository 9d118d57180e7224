"""The Delta sink's counts and look-ups through the batch job (``spark/job.py``: ``run_batch``, and a
replay's adoption through the format) and ``DeltaSink`` against a
real SparkSession (local[2], Delta 4.4 jars: the ``delta_spark`` fixture) and, for the batch job, the
session's Kafka broker read by the Python reader: the row count after an ``OPTIMIZE``, a refused
commit not adopted, a transform run once per batch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import Adoption, BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.sinks import DeltaSink
from airflow_kafka_backpressure.spark.job import adopt_committed, run_batch

from .test_delta_sink import PIPELINE, contents, ranges, write, write_fewer_rows_than_read


def table_spec(
    table: str,
    batch_id: int,
    planned: tuple[OffsetRange, ...],
    *,
    attempt: int,
    bootstrap: str = "127.0.0.1:9",
    transform: str | None = None,
    adopt: Adoption | None = None,
) -> JobSpec:
    """The job spec of batch ``batch_id`` of :data:`PIPELINE` into the Delta table ``table``, read
    by the Python reader."""
    now = int(time.time() * 1000)
    plan = BatchPlan(PIPELINE, batch_id, f"run-{batch_id}", planned, table, 10_000, now)
    return JobSpec(
        plan=plan,
        kafka={"bootstrap.servers": bootstrap},
        launched_at_ms=now,
        reader="python",
        transform=transform,
        attempt=attempt,
        adopt=adopt,
        sink_format="delta",
    )


def last_commit(spark, table: str) -> dict:
    return spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0].asDict()


def test_a_rewrite_after_an_optimize_counts_the_batch_rows_not_those_it_copied(delta_spark, tmp_path):
    """``OPTIMIZE`` put batches 1, 2 and 3 in one file; batch 2's rewrite (its ``replaceWhere``)
    rewrites that file, copying the other batches' rows, which Delta counts in ``numOutputRows``.
    The batch's own rows are what its check compares."""
    table = str(tmp_path / "t")
    for batch_id in (1, 2, 3):
        write(delta_spark, table, batch_id, attempt=1, n=4)
    delta_spark.sql(f"OPTIMIZE delta.`{table}`").collect()
    optimize = last_commit(delta_spark, table)
    assert (optimize["operation"], optimize["operationMetrics"]["numAddedFiles"]) == ("OPTIMIZE", "1")

    commit = write(delta_spark, table, 2, attempt=2, n=4)

    assert (commit.attempt, commit.record_count) == (2, 4)
    metrics = last_commit(delta_spark, table)["operationMetrics"]
    assert (metrics["numOutputRows"], metrics["numCopiedRows"]) == ("12", "8")  # the file was rewritten
    assert contents(delta_spark, table) == {
        (PIPELINE, 1): (4, {1}),
        (PIPELINE, 2): (4, {2}),
        (PIPELINE, 3): (4, {1}),
    }


def test_a_commit_its_row_check_refused_is_not_adopted_by_the_next_replay(delta_spark, tmp_path):
    """Attempt 1 committed 4 rows where the batch read 5: its check failed the batch, and the commit
    stays in the table. The replay must not take it over as the batch's output."""
    table = str(tmp_path / "t")
    write_fewer_rows_than_read(delta_spark, table, 2)
    spec = table_spec(table, 2, ranges(2, 5), attempt=2, adopt=Adoption("a" * 32, ranges(2, 5)))

    metrics, problems = adopt_committed(delta_spark, spec)

    assert metrics is None
    assert problems == [
        "the commit of attempt 1 (table version 0) is not the batch's output: it holds 4 rows of the batch but "
        "the batch must publish 5 (attempt 1's own check refused it)"
    ]


def test_a_transform_runs_once_per_batch(delta_spark, kafka_broker, topic_name, tmp_path, monkeypatch):
    """The transform keeps each record on its first evaluation only (as a non-deterministic one
    differs between runs) and leaves a marker per evaluated record. Counted and written from the
    same computed rows, every record lands and each was evaluated once."""
    from kbp_local.producer import ensure_topic, produce

    ensure_topic(kafka_broker.bootstrap, topic_name, 4)
    produce(kafka_broker.bootstrap, topic_name, count=40, partitions=4)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("KBP_TEST_MARKS", str(marks))
    table = str(tmp_path / "t")
    planned = tuple(OffsetRange(topic_name, q, 0, 10) for q in range(4))
    spec = table_spec(
        table,
        1,
        planned,
        attempt=1,
        bootstrap=kafka_broker.bootstrap,
        transform="tests.integration.spark_transforms:first_evaluation_only",
    )

    metrics = run_batch(delta_spark, spec)

    assert (metrics.records, metrics.adopted) == (40, False)
    assert len(list(marks.iterdir())) == 40  # each record evaluated once
    ids = sorted(json.loads(r["value"])["id"] for r in delta_spark.read.format("delta").load(table).collect())
    assert ids == list(range(40))
    assert Path(table, "_delta_log", f"{0:020d}.json").exists()


@pytest.fixture
def old_parts_unreadable(delta_spark, tmp_path, monkeypatch) -> str:
    """A table of batches 1 to 12 (table versions 0 to 11; Delta's checkpoint at version 10 holds
    the state) whose old parts cannot be read: the log entries of versions 0 to 3 are overwritten
    with garbage (the snapshot does not need them, the checkpoint holds their state) and batch 2's
    data files are deleted. A commit that reads the whole history, or every data file, fails on them.
    The sink's look-up starts with the newest 3 commits here (``recent_commits``)."""
    table = str(tmp_path / "t")
    for batch_id in range(1, 13):
        write(delta_spark, table, batch_id, attempt=1, n=4)
    log_dir = Path(table, "_delta_log")
    assert (log_dir / f"{10:020d}.checkpoint.parquet").exists()
    batch_2 = [json.loads(line) for line in (log_dir / f"{1:020d}.json").read_text().splitlines()]
    for action in batch_2:
        if "add" in action:
            Path(table, action["add"]["path"]).unlink()
    for version in range(4):
        (log_dir / f"{version:020d}.json").write_text("not a Delta commit\n")
    monkeypatch.setattr(DeltaSink, "recent_commits", 3)
    return table


def test_a_replay_looks_up_a_batch_that_never_committed_without_the_whole_history(
    delta_spark, old_parts_unreadable
):
    """Batch 20 failed before its commit: the replay's adoption look-up reads the newest commits
    and finds no row of the batch (Delta's file skipping opens none of the table's files), so it
    does not read back through the history."""
    table = old_parts_unreadable
    spec = table_spec(table, 20, ranges(20, 4), attempt=2, adopt=Adoption("a" * 32, ranges(20, 4)))

    assert adopt_committed(delta_spark, spec) == (None, ["no committed version"])
    assert not DeltaSink().holds_rows(delta_spark, table, pipeline=PIPELINE, batch_id=20)
    assert DeltaSink().holds_rows(delta_spark, table, pipeline=PIPELINE, batch_id=11)


def test_a_rewrite_reads_only_the_batch_files(delta_spark, old_parts_unreadable):
    """Batch 11's rewrite (attempt 2): its ``replaceWhere`` skips the files that cannot hold batch
    11's rows by their column statistics, so batch 2's missing files are never opened."""
    table = old_parts_unreadable

    commit = write(delta_spark, table, 11, attempt=2, n=3, planned=ranges(11, 4))

    assert (commit.attempt, commit.record_count, commit.version) == (2, 3, 12)
    got = contents_without(delta_spark, table, missing=2)
    assert got[(PIPELINE, 11)] == (3, {2}) and got[(PIPELINE, 12)] == (4, {1})


def contents_without(spark, table: str, missing: int) -> dict:
    """:func:`contents` of the table's readable part: every batch but ``missing``, whose files are gone."""
    from pyspark.sql import functions as F

    got = (
        spark.read.format("delta")
        .load(table)
        .where(F.col("kbp_batch_id") != missing)
        .groupBy("kbp_pipeline", "kbp_batch_id")
        .agg(F.count("*"), F.collect_set("written_by"))
        .collect()
    )
    return {(r[0], r[1]): (r[2], set(r[3])) for r in got}
