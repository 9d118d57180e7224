"""The Delta Lake sink (``sinks/delta.py``) against a real SparkSession (local[2], Delta 4.4 jars)
on a local path and on the real S3 server through ``s3a://``.

One SparkSession for the module with the Delta jars and SQL extension and hadoop-aws on its class
path (the ``delta_spark`` fixture of ``conftest.py``): Delta's jars must be on the JVM's class path
when it starts, so this module starts its own JVM and ends it afterwards (the session-wide ``spark``
fixture then starts a fresh one). It refuses to run beside another SparkContext in the process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyarrow.fs import FileSelector

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks import (
    SINK_FORMATS,
    BatchCommit,
    DeltaSink,
    IcebergSink,
    ParquetSink,
    SinkFenced,
    SinkFormatError,
    UnknownSinkFormat,
    sink_format_for,
)
from airflow_kafka_backpressure.sinks.delta import BATCH_COLUMN, PIPELINE_COLUMN
from kbp_local.jars import jar_paths

PIPELINE = "orders"


def ranges(batch_id: int, n: int) -> tuple[OffsetRange, ...]:
    """Ranges of batch ``batch_id`` (two partitions, ``n`` records in all): the plan a batch has."""
    start = batch_id * 1000
    half = n // 2
    return (OffsetRange("orders", 0, start, start + half), OffsetRange("orders", 1, start, start + n - half))


def rows(spark, batch_id: int, n: int, attempt: int):
    """``n`` rows of batch ``batch_id``, each marked with the attempt that produced it."""
    return spark.range(n).selectExpr("id AS offset", f"{attempt} AS written_by", f"'b{batch_id}' AS value")


def write(
    spark,
    table: str,
    batch_id: int,
    attempt: int,
    n: int,
    pipeline: str = PIPELINE,
    planned: tuple[OffsetRange, ...] | None = None,
) -> BatchCommit:
    """``n`` rows of batch ``batch_id`` committed by ``attempt``, planned as ``planned`` (default
    :func:`ranges`)."""
    return DeltaSink().write_batch(
        spark,
        rows(spark, batch_id, n, attempt),
        table,
        pipeline=pipeline,
        batch_id=batch_id,
        attempt=attempt,
        ranges=ranges(batch_id, n) if planned is None else planned,
        expected_records=n,
    )


def contents(spark, table: str) -> dict[tuple[str, int], tuple[int, set[int]]]:
    """(pipeline, batch id) -> (row count, attempts that wrote the rows), as a reader of the table
    sees it."""
    from pyspark.sql import functions as F

    got = (
        spark.read.format("delta")
        .load(table)
        .groupBy(PIPELINE_COLUMN, BATCH_COLUMN)
        .agg(F.count("*"), F.collect_set("written_by"))
        .collect()
    )
    return {(r[0], r[1]): (r[2], set(r[3])) for r in got}


def table_version(spark, table: str) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]["version"]


def batch_commits(spark, table: str, batch_id: int) -> list[dict]:
    """The userMetadata of every commit of the table that names ``batch_id``, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    metas = [json.loads(r["userMetadata"]) for r in history if r["userMetadata"]]
    return [m for m in metas if m["batch_id"] == batch_id]


def test_the_delta_jars_are_delta_spark_and_delta_storage_without_what_pyspark_ships():
    from kbp_local.jars import (
        artifact_name,
        delta_jars,
        delta_version,
        pyspark_shipped,
    )

    names = {Path(p).name for p in jar_paths(delta_jars())}
    assert {f"delta-spark_2.13-{delta_version()}.jar", f"delta-storage-{delta_version()}.jar"} <= names
    assert not {artifact_name(n) for n in names} & pyspark_shipped()


def test_the_registry_names_delta():
    assert SINK_FORMATS == {"parquet": ParquetSink, "delta": DeltaSink, "iceberg": IcebergSink}
    assert isinstance(sink_format_for("delta"), DeltaSink)
    with pytest.raises(UnknownSinkFormat, match="unknown sink format 'hudi': choose one of delta, iceberg"):
        sink_format_for("hudi")


def test_a_batch_lands_once_and_a_retry_of_the_same_attempt_adds_nothing(delta_spark, tmp_path):
    table = str(tmp_path / "t")
    first = write(delta_spark, table, 1, attempt=1, n=10)
    assert (first.batch_id, first.attempt, first.record_count, first.ranges) == (1, 1, 10, ranges(1, 10))
    version = table_version(delta_spark, table)

    # the worker died after the commit and Airflow retried the task with the same ledger attempt
    again = write(delta_spark, table, 1, attempt=1, n=10)

    assert again == first
    assert table_version(delta_spark, table) == version  # Delta skipped it: no new commit at all
    assert contents(delta_spark, table) == {(PIPELINE, 1): (10, {1})}
    assert len(batch_commits(delta_spark, table, 1)) == 1


def test_the_read_back_looks_at_the_newest_commits_then_the_whole_history(delta_spark, tmp_path, monkeypatch):
    """A write reads its batch back from the table's newest ``recent_commits`` commits (a commit's
    cost does not grow with the history); a retry that Delta skipped finds the batch's commit
    further back, in the whole history."""
    monkeypatch.setattr(DeltaSink, "recent_commits", 2)
    table = str(tmp_path / "t")
    first = write(delta_spark, table, 1, attempt=1, n=4)
    for batch_id in (2, 3, 4):
        write(delta_spark, table, batch_id, attempt=1, n=2)
    sink = DeltaSink()
    assert sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=1, within_last=2) is None
    assert sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=4, within_last=2).batch_id == 4

    again = write(delta_spark, table, 1, attempt=1, n=4)  # skipped by Delta: its commit is 4 versions back

    assert again == first
    assert len(batch_commits(delta_spark, table, 1)) == 1


def test_a_replay_of_batch_5_after_batches_6_and_7_lands(delta_spark, tmp_path):
    table = str(tmp_path / "t")
    write(delta_spark, table, 6, attempt=1, n=4)
    write(delta_spark, table, 7, attempt=1, n=3)

    replay = write(delta_spark, table, 5, attempt=1, n=5)

    assert (replay.batch_id, replay.record_count) == (5, 5)
    assert contents(delta_spark, table) == {
        (PIPELINE, 5): (5, {1}),
        (PIPELINE, 6): (4, {1}),
        (PIPELINE, 7): (3, {1}),
    }


def test_one_app_id_per_pipeline_would_drop_that_replay(delta_spark, tmp_path):
    """Why the sink uses one txnAppId per batch: with one per pipeline and txnVersion = batch id,
    Delta skips batch 5 after batch 7 without a word."""
    table = str(tmp_path / "t")
    for batch_id in (6, 7, 5):
        (
            rows(delta_spark, batch_id, 2, 1)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", "kbp:orders")
            .option("txnVersion", str(batch_id))
            .save(table)
        )
    got = {r[0] for r in delta_spark.read.format("delta").load(table).select("value").distinct().collect()}
    assert got == {"b6", "b7"}


def test_a_newer_attempt_replaces_the_batch_rows_and_an_older_one_is_refused(delta_spark, tmp_path):
    table = str(tmp_path / "t")
    write(delta_spark, table, 4, attempt=1, n=6)
    write(delta_spark, table, 5, attempt=1, n=5)
    write(delta_spark, table, 5, attempt=1, n=5, pipeline="payments")  # same batch id, other pipeline

    # the newer attempt reads the batch's planned ranges again: fewer records now (the test's rows)
    newer = write(delta_spark, table, 5, attempt=2, n=3, planned=ranges(5, 5))

    assert (newer.attempt, newer.record_count) == (2, 3)
    expected = {(PIPELINE, 4): (6, {1}), (PIPELINE, 5): (3, {2}), ("payments", 5): (5, {1})}
    assert contents(delta_spark, table) == expected
    version = table_version(delta_spark, table)

    # the first attempt was a zombie: it comes back after attempt 2 committed
    with pytest.raises(SinkFenced, match=r"attempt 1 was refused, attempt 2 has committed the batch"):
        write(delta_spark, table, 5, attempt=1, n=5)

    assert table_version(delta_spark, table) == version
    assert contents(delta_spark, table) == expected
    assert [m["attempt"] for m in batch_commits(delta_spark, table, 5) if m["pipeline"] == PIPELINE] == [1, 2]


def test_a_downstream_task_reads_the_version_a_batch_committed(delta_spark, tmp_path):
    """The commit's ``read_at`` (the table version: what the batch's Asset event carries) reads
    the rows that version holds, with delta-rs, even after a newer attempt replaced them; without
    it, the current version."""
    table = str(tmp_path / "t")
    first = write(delta_spark, table, 5, attempt=1, n=6)
    write(delta_spark, table, 6, attempt=1, n=4)
    second = write(delta_spark, table, 5, attempt=2, n=3, planned=ranges(5, 6))
    assert (first.read_at, second.read_at) == ({"version": 0}, {"version": 2})

    def read(read_at) -> list[int]:
        rows = DeltaSink().batch_dataset(table, pipeline=PIPELINE, batch_id=5, read_at=read_at).to_table()
        return sorted(rows.column("written_by").to_pylist())

    assert read(first.read_at) == [1] * 6
    # the whole table at that version: batch 5 alone then (batch 6 came after)
    assert DeltaSink().table_dataset(table, read_at=first.read_at).count_rows() == 6
    assert read(second.read_at) == [2] * 3
    assert read(None) == [2] * 3


def test_a_first_attempt_appends_and_a_later_one_replaces_the_batch(delta_spark, tmp_path):
    """Attempt 1 of a batch is a plain append (it reads no data file of the table, so its cost does
    not grow with the table); a later attempt overwrites with ``replaceWhere`` on the batch."""
    table = str(tmp_path / "t")
    write(delta_spark, table, 1, attempt=1, n=4)
    write(delta_spark, table, 2, attempt=1, n=3)
    write(delta_spark, table, 2, attempt=2, n=2, planned=ranges(2, 3))

    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    modes = [(json.loads(r["userMetadata"])["batch_id"], r["operationParameters"]["mode"]) for r in history]
    assert modes == [(1, "Append"), (2, "Append"), (2, "Overwrite")]
    assert "kbp_batch_id = 2" in history[-1]["operationParameters"]["predicate"]
    assert contents(delta_spark, table) == {(PIPELINE, 1): (4, {1}), (PIPELINE, 2): (2, {2})}


def test_what_a_batch_committed_reads_back_from_the_delta_log(delta_spark, tmp_path):
    table = str(tmp_path / "t")
    sink = DeltaSink()
    assert sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=3) is None  # no table yet
    write(delta_spark, table, 3, attempt=2, n=7)
    write(delta_spark, table, 8, attempt=1, n=2)

    got = sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=3)

    assert got == BatchCommit(PIPELINE, 3, 2, ranges(3, 7), 7, version=0)
    assert sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=9) is None
    assert sink.committed(delta_spark, table, pipeline="payments", batch_id=3) is None
    assert sink.is_committed(delta_spark, table, pipeline=PIPELINE, batch_id=3)
    assert sink.is_committed(delta_spark, table, pipeline=PIPELINE, batch_id=3, attempt=2)
    assert not sink.is_committed(delta_spark, table, pipeline=PIPELINE, batch_id=3, attempt=1)
    # the commit's own record in _delta_log: commitInfo.userMetadata and the txn of the batch
    actions = [
        json.loads(line) for line in (Path(table) / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    ]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert json.loads(info["userMetadata"])["ranges"] == [r.to_dict() for r in ranges(3, 7)]
    assert [a["txn"] for a in actions if "txn" in a][0] | {"lastUpdated": 0} == {
        "appId": "kbp:orders:batch:3",
        "version": 2,
        "lastUpdated": 0,
    }


def write_fewer_rows_than_read(spark, table: str, batch_id: int) -> None:
    """Attempt 1 of batch ``batch_id`` commits 4 rows where the batch read 5: its check fails the
    batch (the commit stays in the table)."""
    with pytest.raises(SinkFormatError, match=r"attempt 1 committed 4 rows .* but the batch read 5"):
        DeltaSink().write_batch(
            spark,
            rows(spark, batch_id, 4, 1),
            table,
            pipeline=PIPELINE,
            batch_id=batch_id,
            attempt=1,
            ranges=ranges(batch_id, 5),
            expected_records=5,
        )


def test_a_commit_of_another_row_count_than_was_read_fails(delta_spark, tmp_path):
    write_fewer_rows_than_read(delta_spark, str(tmp_path / "t"), 2)


def test_delta_commits_through_an_atomic_create_on_local_paths_and_a_single_driver_store_on_s3a(
    delta_spark, tmp_path
):
    """The LogStore Delta picks by the path's scheme (what docs/sinks.md's guarantees per store rest
    on): HDFSLogStore (create-if-absent by rename) for file: and hdfs:, S3SingleDriverLogStore
    (mutual exclusion only within one driver's memory) for s3a: and s3:."""
    jvm = delta_spark._jvm
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        delta_spark._jsparkSession, str(tmp_path / "t")
    ).store()

    def impl(uri: str) -> str:
        return store.getDelegate(jvm.org.apache.hadoop.fs.Path(uri)).logStoreImpl().getClass().getSimpleName()

    assert {uri: impl(uri) for uri in (f"file:{tmp_path}/t", "hdfs://nn/t", "s3a://b/t", "s3://b/t")} == {
        f"file:{tmp_path}/t": "HDFSLogStore",
        "hdfs://nn/t": "HDFSLogStore",
        "s3a://b/t": "S3SingleDriverLogStore",
        "s3://b/t": "S3SingleDriverLogStore",
    }


def test_the_same_protocol_on_s3a(delta_spark, s3_server, s3_bucket):
    """Every property above, on the real S3 server through ``s3a://``; pyarrow's S3 filesystem sees
    the Delta log Spark wrote."""
    table = f"s3a://{s3_bucket}/tables/orders"
    sink = DeltaSink()
    write(delta_spark, table, 6, attempt=1, n=4)
    write(delta_spark, table, 5, attempt=1, n=5)  # a replay after batch 6
    write(delta_spark, table, 5, attempt=1, n=5)  # a retry: skipped
    write(delta_spark, table, 5, attempt=2, n=3, planned=ranges(5, 5))  # a newer attempt: replaces
    with pytest.raises(SinkFenced):
        write(delta_spark, table, 5, attempt=1, n=5)  # a zombie

    assert contents(delta_spark, table) == {(PIPELINE, 5): (3, {2}), (PIPELINE, 6): (4, {1})}
    assert sink.committed(delta_spark, table, pipeline=PIPELINE, batch_id=5) == BatchCommit(
        PIPELINE, 5, 2, ranges(5, 5), 3, version=2
    )
    s3 = s3_server.filesystem()
    logs = sorted(
        i.base_name
        for i in s3.get_file_info(FileSelector(f"{s3_bucket}/tables/orders/_delta_log"))
        if i.base_name.endswith(".json")
    )
    assert logs == [f"{v:020d}.json" for v in range(3)]


def write_other_batch_3(spark, table: str, attempt: int, n: int) -> BatchCommit:
    """Batch 3 of a ledger restored from an older backup: ``n`` records planned at offsets far from
    every :func:`ranges`, another batch's."""
    return write(spark, table, 3, attempt, n, planned=(OffsetRange("orders", 0, 500_000, 500_000 + n),))


def test_a_first_attempt_of_a_batch_id_the_table_holds_for_other_offsets_is_refused(delta_spark, tmp_path):
    """The ledger was restored from an older backup: its batch 3 (attempt 1) is planned for other
    offsets than the table's batch 3, with as many records. Delta skips the write as a retry of the
    committed attempt 1; the sink must not report the old commit as this batch's: its records were
    never written."""
    table = str(tmp_path / "t")
    write(delta_spark, table, 3, attempt=1, n=5)
    version = table_version(delta_spark, table)

    with pytest.raises(SinkFormatError) as refused:
        write_other_batch_3(delta_spark, table, attempt=1, n=5)

    message = str(refused.value)
    assert "orders-0[3000, 3002), orders-1[3000, 3003)" in message  # the committed ranges
    assert "orders-0[500000, 500005)" in message  # the planned ones
    assert "restored from an older backup" in message and "new table" in message
    assert table_version(delta_spark, table) == version
    assert contents(delta_spark, table) == {(PIPELINE, 3): (5, {1})}


def test_a_rewrite_of_a_batch_id_the_table_holds_for_other_offsets_is_refused_before_it_deletes_them(
    delta_spark, tmp_path
):
    """The same restored ledger's batch 3 at attempt 2: its ``replaceWhere`` would delete the old
    batch 3's rows. It is refused before anything is written."""
    table = str(tmp_path / "t")
    write(delta_spark, table, 3, attempt=1, n=5)
    version = table_version(delta_spark, table)

    with pytest.raises(SinkFormatError, match=r"Nothing was written, the table is unchanged") as refused:
        write_other_batch_3(delta_spark, table, attempt=2, n=4)

    assert "orders-0[3000, 3002), orders-1[3000, 3003)" in str(refused.value)
    assert "orders-0[500000, 500004)" in str(refused.value)
    assert table_version(delta_spark, table) == version
    assert contents(delta_spark, table) == {(PIPELINE, 3): (5, {1})}


def test_a_replay_trimmed_at_the_start_replaces_the_batch_it_belongs_to(delta_spark, tmp_path):
    """Retention took the first offsets of batch 3 before its replay: the replay's ranges start
    later and end where the committed ones do. That is the same batch: it is replaced."""
    table = str(tmp_path / "t")
    write(delta_spark, table, 3, attempt=1, n=6)
    trimmed = (OffsetRange("orders", 0, 3001, 3003), OffsetRange("orders", 1, 3002, 3003))

    commit = write(delta_spark, table, 3, attempt=2, n=3, planned=trimmed)

    assert (commit.attempt, commit.ranges) == (2, trimmed)
    assert contents(delta_spark, table) == {(PIPELINE, 3): (3, {2})}


def test_a_batch_spanning_three_days_lands_in_three_partitions_and_its_replay_rewrites_only_its_rows(
    delta_spark, tmp_path
):
    """``partition_by`` day(timestamp): a ``kbp_day`` DATE partition column (the UTC day); read back
    with delta-rs (``deltalake``), not Spark: the partitions each batch's files are in, and every
    row by id after a replay of batch 1 rewrote its rows in three partitions."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from airflow_kafka_backpressure.sinks.table import PartitionBy

    from .test_iceberg_sink import days_rows

    table, day = str(tmp_path / "t"), PartitionBy("day", "timestamp")

    def commit(batch_id: int, attempt: int, first_day: int, partition_by=day) -> BatchCommit:
        return DeltaSink().write_batch(
            delta_spark, days_rows(delta_spark, batch_id, 9, attempt, first_day), table, pipeline=PIPELINE,
            batch_id=batch_id, attempt=attempt, ranges=ranges(batch_id, 9), expected_records=9,
            partition_by=partition_by,
        )  # fmt: skip

    def rows_by_id() -> dict[int, dict]:
        return {r["id"]: r for r in DeltaTable(table).to_pyarrow_table().to_pylist()}

    commit(1, 1, 0)  # 2025-11-24, 25, 26
    commit(2, 1, 1)  # 2025-11-25, 26, 27
    dt = DeltaTable(table)
    assert dt.metadata().partition_columns == ["kbp_day"]
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    by_batch: dict[int, set[str]] = {}
    for a in adds:
        batch = next(r["kbp_batch_id"] for r in pq_rows(table, a["path"]))
        by_batch.setdefault(batch, set()).add(str(a["partition.kbp_day"]))
    assert by_batch == {
        1: {"2025-11-24", "2025-11-25", "2025-11-26"},
        2: {"2025-11-25", "2025-11-26", "2025-11-27"},
    }
    before = rows_by_id()

    commit(1, 2, 0)  # the replay: batch 1's rows replaced in its three partitions, batch 2's untouched
    after = rows_by_id()
    assert sorted(after) == sorted(before)
    assert {i: r["written_by"] for i, r in after.items() if i >= 2000} == {i: 1 for i in range(2000, 2009)}
    assert {r["written_by"] for i, r in after.items() if i < 2000} == {2}
    assert {str(r["kbp_day"]) for r in after.values()} == {
        "2025-11-24",
        "2025-11-25",
        "2025-11-26",
        "2025-11-27",
    }

    with pytest.raises(
        SinkFormatError, match=r"partitioning is not the pipeline's sink_options.partition_by \(none\)"
    ):
        commit(3, 1, 0, partition_by=None)


def pq_rows(table: str, path: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(f"{table}/{path}").to_pylist()
