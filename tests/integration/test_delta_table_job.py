"""The Delta sink's counts and look-ups through the batch job (``spark/job.py``: ``run_batch``, and a
replay's adoption through the format) and ``DeltaSink`` against a
real SparkSession (local[2], Delta 4.4 jars: the ``delta_spark`` fixture) and, for the batch job, the
session's Kafka broker read by the Python reader: the row count after an ``OPTIMIZE``, a refused
commit not adopted, a transform run once per batch. And the table's maintenance
(``sinks/delta_maintenance.py``: delta-rs's OPTIMIZE, the transaction ids' retention, VACUUM) between
the sink's commits: after a compaction a replay's rewrite still replaces exactly its batch and its
commit still counts the batch's rows (one module, one JVM with Delta's jars).

What stands in for the maintenance, and why: of the 200 small batches of the compaction test, the
first two are the sink's (Spark) commits and 198 are appended by delta-rs with the sink's
``userMetadata``, not by 198 Spark jobs (about 1 s each here): the files and commits are the small,
partitioned ones batches leave. A retention of 0 s (a plain options object) stands in for the days
a real retention waits; the pipelines file's rule is tested on the configuration
(tests/unit/test_maintenance_config.py).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_kafka_backpressure.batch.models import Adoption, BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.sinks import DeltaSink
from airflow_kafka_backpressure.sinks.delta_maintenance import TXN_RETENTION
from airflow_kafka_backpressure.sinks.delta_rs import add_actions
from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN, PIPELINE_COLUMN, PartitionBy
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


@pytest.fixture(scope="module")
def old_parts_table(delta_spark, tmp_path_factory) -> Path:
    """The table of :func:`old_parts_unreadable`, built once for the module (12 Spark commits)."""
    table = tmp_path_factory.mktemp("old-parts") / "t"
    for batch_id in range(1, 13):
        write(delta_spark, str(table), batch_id, attempt=1, n=4)
    log_dir = table / "_delta_log"
    assert (log_dir / f"{10:020d}.checkpoint.parquet").exists()
    batch_2 = [json.loads(line) for line in (log_dir / f"{1:020d}.json").read_text().splitlines()]
    for action in batch_2:
        if "add" in action:
            (table / action["add"]["path"]).unlink()
    for version in range(4):
        (log_dir / f"{version:020d}.json").write_text("not a Delta commit\n")
    return table


@pytest.fixture
def old_parts_unreadable(old_parts_table, tmp_path, monkeypatch) -> str:
    """A table of batches 1 to 12 (table versions 0 to 11; Delta's checkpoint at version 10 holds
    the state) whose old parts cannot be read: the log entries of versions 0 to 3 are overwritten
    with garbage (the snapshot does not need them, the checkpoint holds their state) and batch 2's
    data files are deleted. A commit that reads the whole history, or every data file, fails on them.
    The sink's look-up starts with the newest 3 commits here (``recent_commits``). Each test gets
    its own copy of the module's table."""
    table = tmp_path / "t"
    shutil.copytree(old_parts_table, table)
    monkeypatch.setattr(DeltaSink, "recent_commits", 3)
    return str(table)


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


# ----- the table's maintenance ------------------------------------------------------------
DAY_S = 86_400
DAY = PartitionBy.parse("day(timestamp)")


def options(retention_s: float = 3600.0, sort_by: str | None = None) -> SimpleNamespace:
    """The maintenance's options with a retention the pipelines file would refuse (module doc)."""
    return SimpleNamespace(retention_s=retention_s, target_file_bytes=128 * 1024 * 1024, sort_by=sort_by)


def one_range(batch_id: int, n: int) -> tuple[OffsetRange, ...]:
    return (OffsetRange("orders", 0, batch_id * 1000, batch_id * 1000 + n),)


def sink_batch(spark, table: str, batch_id: int, attempt: int, n: int = 30):
    """Batch ``batch_id`` through the Delta sink: ``n`` rows over three days."""
    rows = spark.range(n).selectExpr(
        f"{batch_id} * 1000 + id AS offset",
        f"CAST({attempt} AS INT) AS written_by",
        f"timestamp_micros((id % 3) * {DAY_S} * 1000000 + id) AS timestamp",
    )
    return DeltaSink().write_batch(
        spark,
        rows,
        table,
        pipeline=PIPELINE,
        batch_id=batch_id,
        attempt=attempt,
        ranges=one_range(batch_id, n),
        expected_records=n,
        partition_by=DAY,
    )


def appended(table: str, batch_id: int, n: int) -> None:
    """Batch ``batch_id`` as the sink's commit leaves it (module doc), appended by delta-rs."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    schema = pa.schema(DeltaTable(table).schema().to_arrow())
    stamps = [dt.datetime.fromtimestamp((i % 3) * DAY_S + i / 1e6, dt.timezone.utc) for i in range(n)]
    rows = pa.table(
        {
            PIPELINE_COLUMN: [PIPELINE] * n,
            BATCH_COLUMN: [batch_id] * n,
            "offset": [batch_id * 1000 + i for i in range(n)],
            "written_by": [1] * n,
            "timestamp": stamps,
            "kbp_day": [s.date() for s in stamps],
        }
    ).cast(schema)
    meta = {
        "pipeline": PIPELINE,
        "batch_id": batch_id,
        "attempt": 1,
        "ranges": [r.to_dict() for r in one_range(batch_id, n)],
        "expected_records": n,
    }
    write_deltalake(
        table,
        rows,
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(meta)}),
    )


def files_per_partition(table: str) -> Counter:
    from deltalake import DeltaTable

    actions = add_actions(DeltaTable(table))
    return Counter(str(a["partition.kbp_day"]) for a in actions)


def ids(table: str) -> Counter:
    """(batch, offset, attempt) of every row, as delta-rs reads the table's current version."""
    from deltalake import DeltaTable

    read = DeltaTable(table).to_pyarrow_table()
    return Counter(
        zip(
            read.column(BATCH_COLUMN).to_pylist(),
            read.column("offset").to_pylist(),
            read.column("written_by").to_pylist(),
        )
    )


def test_compacting_200_small_batches_leaves_at_most_2_files_per_partition_and_a_replay_rewrites_its_batch(
    delta_spark, tmp_path
):
    table = str(tmp_path / "events")
    sink_batch(delta_spark, table, 1, 1)
    sink_batch(delta_spark, table, 2, 1)
    for batch_id in range(3, 201):
        appended(table, batch_id, 6)
    before, rows = files_per_partition(table), ids(table)
    assert len(before) == 3 and min(before.values()) >= 200
    assert sum(rows.values()) == 60 + 198 * 6 and set(rows.values()) == {1}

    report = DeltaSink().maintain(table, options())

    after = files_per_partition(table)
    assert len(after) == 3 and max(after.values()) <= 2, after
    assert ids(table) == rows
    assert report.files_removed == sum(before.values()) and report.files_added == sum(after.values())
    assert max(p.files for p in report.after.values()) <= 2
    from deltalake import DeltaTable

    assert DeltaTable(table).metadata().configuration[TXN_RETENTION] == "interval 1 hours"

    # Spark's sink after delta-rs's OPTIMIZE: the batch's commit is still read back, and a replay
    # (attempt 2) replaces exactly its 30 rows, counting them and not the rows it copied
    assert DeltaSink().committed(delta_spark, table, pipeline=PIPELINE, batch_id=1).record_count == 30
    commit = sink_batch(delta_spark, table, 1, 2)
    assert (commit.attempt, commit.record_count) == (2, 30)
    expected = Counter({k: v for k, v in rows.items() if k[0] != 1})
    expected.update({(1, 1000 + i, 2): 1 for i in range(30)})
    assert ids(table) == expected


def test_vacuum_deletes_only_what_the_table_no_longer_references(delta_spark, tmp_path):
    table = str(tmp_path / "events")
    for batch_id in (1, 2, 3):
        sink_batch(delta_spark, table, batch_id, 1)
    # an attempt whose job wrote a file and never committed (its worker died)
    stray = Path(table) / "kbp_day=1970-01-01" / "part-99999-never-committed.snappy.parquet"
    stray.write_bytes(b"PAR1 never committed")
    rows = ids(table)

    kept = DeltaSink().maintain(table, options(retention_s=3600))
    assert kept.files_deleted == 0 and stray.exists()  # younger than the retention: may be in flight

    report = DeltaSink().maintain(table, options(retention_s=0))
    assert not stray.exists() and report.files_deleted >= kept.files_removed + 1
    from deltalake import DeltaTable

    live = {str(Path(table) / a["path"]) for a in add_actions(DeltaTable(table))}
    on_disk = {str(p) for p in Path(table).rglob("*.parquet") if "_delta_log" not in str(p)}
    assert on_disk == live
    assert ids(table) == rows
    assert delta_spark.read.format("delta").load(table).count() == 90  # Spark reads it whole too


def test_on_s3_delta_rs_compacts_and_vacuums_between_the_sinks_commits(
    delta_spark, s3_server, s3_bucket, monkeypatch
):
    """The same maintenance on a table in a bucket of the session's S3 server: Spark's sink writes
    through ``s3a://``, delta-rs compacts and VACUUMs through the worker's AWS_* environment (its
    commit in unsafe-rename mode, which the table's ledger lock makes safe), and the sink's replay
    after it replaces exactly its batch."""
    from pyarrow.fs import FileSelector

    for key, value in s3_server.aws_environment().items():
        monkeypatch.setenv(key, value)
    table = f"s3a://{s3_bucket}/events"
    for batch_id in (1, 2, 3):
        sink_batch(delta_spark, table, batch_id, 1, n=12)
    fs = s3_server.filesystem()
    stray = f"{s3_bucket}/events/kbp_day=1970-01-02/part-99999-never-committed.snappy.parquet"
    with fs.open_output_stream(stray) as f:
        f.write(b"PAR1 never committed")

    report = DeltaSink().maintain(table, options(retention_s=0))

    assert max(p.files for p in report.after.values()) == 1
    assert report.files_removed == sum(p.files for p in report.before.values()) >= 9
    listed = {
        i.path
        for i in fs.get_file_info(FileSelector(f"{s3_bucket}/events", recursive=True))
        if i.is_file and "_delta_log" not in i.path
    }
    assert stray not in listed and len(listed) == 3  # one compacted file a day, nothing else
    commit = sink_batch(delta_spark, table, 1, 2, n=12)
    assert (commit.attempt, commit.record_count) == (2, 12)
    got = delta_spark.read.format("delta").load(table).groupBy(BATCH_COLUMN, "written_by").count().collect()
    assert {(r[0], r[1]): r[2] for r in got} == {(1, 2): 12, (2, 1): 12, (3, 1): 12}
