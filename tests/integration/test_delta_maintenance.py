"""The Delta table's maintenance (``sinks/delta_maintenance.py``: delta-rs's OPTIMIZE, the
transaction ids' retention, VACUUM) on a local path, between commits of the Delta sink itself (the
module's local[2] SparkSession with Delta's jars, ``delta_spark``): after a compaction a replay's
rewrite still replaces exactly its batch and its commit still counts the batch's rows.

What stands in, and why: of the 200 small batches of the compaction test, the first two are the
sink's (Spark) commits and 198 are appended by delta-rs with the sink's ``userMetadata``, not by 198
Spark jobs (about 1 s each here): the files and commits are the small, partitioned ones batches
leave. A retention of 0 s (a plain options object) stands in for the days a real retention waits;
the pipelines file's rule is tested on the configuration (tests/unit/test_maintenance_config.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks import DeltaSink
from airflow_kafka_backpressure.sinks.delta_maintenance import TXN_RETENTION, add_actions
from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN, PIPELINE_COLUMN, PartitionBy

PIPELINE = "orders"
DAY_S = 86_400
DAY = PartitionBy.parse("day(timestamp)")


def options(retention_s: float = 3600.0, sort_by: str | None = None) -> SimpleNamespace:
    """The maintenance's options with a retention the pipelines file would refuse (module doc)."""
    return SimpleNamespace(retention_s=retention_s, target_file_bytes=128 * 1024 * 1024, sort_by=sort_by)


def ranges(batch_id: int, n: int) -> tuple[OffsetRange, ...]:
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
        ranges=ranges(batch_id, n),
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
        "ranges": [r.to_dict() for r in ranges(batch_id, n)],
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
