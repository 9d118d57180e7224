"""The Iceberg table's maintenance (``sinks/iceberg_maintenance.py``) on a real pyiceberg SQL
catalog (SQLite) and local files: compaction, snapshot expiry, unreferenced files; the sink's own
commits (Spark writing the files, the session's local[2] SparkSession) before and after it; a batch
and a maintenance racing through the ledger's lock of the table; and the shipped maintenance DAG
under real Airflow (``dag.test()``).

What stands in, and why: the 200 small batches of the compaction test are appended by pyiceberg
(``table.append`` with the sink's ``kbp.batch`` summary), not by 200 Spark jobs (about 1 s each
here): the files and snapshots are what the sink's commits leave, one small file per partition a
batch touched, and the batches the test rewrites afterwards go through the sink itself. A
retention of 0 s (a plain options object) stands in for the days a real retention waits; the
pipelines file's rule (>= 1 h and >= a batch's longest time in flight) is tested on the
configuration itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from types import SimpleNamespace

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.sinks import IcebergSink
from airflow_kafka_backpressure.sinks.iceberg import BATCH_PROPERTY
from airflow_kafka_backpressure.sinks.table import BATCH_COLUMN, PIPELINE_COLUMN, PartitionBy

from . import airflow_harness as af

PIPELINE = "orders"
DAY_S = 86_400
DAY = PartitionBy.parse("day(timestamp)")


def options(retention_s: float = 0.0, target_mb: int = 128, sort_by: str | None = None) -> SimpleNamespace:
    """The maintenance's options with a retention the pipelines file would refuse (module doc)."""
    return SimpleNamespace(
        retention_s=retention_s, target_file_bytes=target_mb * 1024 * 1024, sort_by=sort_by
    )


def batch_rows(batch_id: int, n: int, attempt: int = 1, first_day: int = 0):
    """``n`` rows of batch ``batch_id``, the sink's columns first, spread over three days."""
    import pyarrow as pa

    return pa.table(
        {
            PIPELINE_COLUMN: [PIPELINE] * n,
            BATCH_COLUMN: pa.array([batch_id] * n, pa.int64()),
            "offset": pa.array([batch_id * 1000 + i for i in range(n)], pa.int64()),
            "written_by": pa.array([attempt] * n, pa.int32()),
            "timestamp": pa.array(
                [(first_day + i % 3) * DAY_S * 1_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
        }
    )


def spark_rows(spark, batch_id: int, n: int, attempt: int = 1):
    """:func:`batch_rows` as a Spark DataFrame, before the sink adds its columns."""
    return spark.range(n).selectExpr(
        f"{batch_id} * 1000 + id AS offset",
        f"CAST({attempt} AS INT) AS written_by",
        f"timestamp_micros((id % 3) * {DAY_S} * 1000000 + id) AS timestamp",
    )


def appended(sink_format: IcebergSink, sink: str, batch_ids: range, n: int) -> None:
    """Batches ``batch_ids`` as the sink's commits leave them (module doc): each a Parquet file per
    day its rows span, in a folder of its attempt, added by a snapshot of its own with ``kbp.batch``
    in its summary (ten snapshots a catalog swap: the test's time is not the point)."""
    for chunk in range(0, len(batch_ids), 10):
        table = sink_format.load(sink) or sink_format._create(sink, batch_rows(0, 1).schema, DAY)
        with table.transaction() as tx:
            for batch_id in batch_ids[chunk : chunk + 10]:
                files = _batch_files(sink, batch_id, n, None if "://" not in sink else sink_format.io(sink))
                meta = {
                    "pipeline": PIPELINE,
                    "batch_id": batch_id,
                    "attempt": 1,
                    "ranges": [OffsetRange("orders", 0, batch_id * 1000, batch_id * 1000 + n).to_dict()],
                    "expected_records": n,
                }
                tx.add_files(
                    files, snapshot_properties={BATCH_PROPERTY: json.dumps(meta)}, check_duplicate_files=False
                )


def _batch_files(sink: str, batch_id: int, n: int, io=None) -> list[str]:
    """Batch ``batch_id``'s Parquet files, one per day its rows span (through ``io``, pyiceberg's
    file IO of the sink's store; local files by default)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = batch_rows(batch_id, n)
    folder = f"{sink}/data/{BATCH_COLUMN}={batch_id}/1-standin"
    days = pc.floor_temporal(rows.column("timestamp"), unit="day")
    files = []
    for k, day in enumerate(sorted(set(days.to_pylist()))):
        files.append(f"{folder}/part-{k}.parquet")
        if io is None:
            os.makedirs(folder, exist_ok=True)
            pq.write_table(rows.filter(pc.equal(days, day)), files[-1])
        else:
            with io.new_output(files[-1]).create() as stream:
                pq.write_table(rows.filter(pc.equal(days, day)), stream)
    return files


def files_per_partition(table) -> Counter:
    return Counter(task.file.partition for task in table.scan().plan_files())


def ids(table) -> Counter:
    read = table.scan().to_arrow()
    return Counter(zip(read.column(BATCH_COLUMN).to_pylist(), read.column("offset").to_pylist()))


def test_compacting_200_small_batches_leaves_at_most_2_files_per_partition_each_row_once(tmp_path):
    sink_format = IcebergSink(f"sqlite:///{tmp_path}/catalog.db")
    sink = str(tmp_path / "events")
    appended(sink_format, sink, range(1, 201), 6)
    table = sink_format.load(sink)
    before, rows = files_per_partition(table), ids(table)
    assert len(before) == 3 and min(before.values()) == 200  # a small file per day per batch
    assert sum(rows.values()) == 1200 and set(rows.values()) == {1}

    report = sink_format.maintain(sink, options(retention_s=3600))  # nothing old enough to drop

    table = sink_format.load(sink)
    after = files_per_partition(table)
    assert len(after) == 3 and max(after.values()) <= 2, after
    assert ids(table) == rows  # every row once, none lost
    assert (report.files_removed, report.files_added) == (600, sum(after.values()))
    assert {p.files for p in report.before.values()} == {200}
    assert max(p.files for p in report.after.values()) <= 2
    # a reader filtering one day opens that day's files only
    one_day = table.scan(row_filter="timestamp < '1970-01-02T00:00:00+00:00'").plan_files()
    assert len(list(one_day)) <= 2
    # within the retention, every batch's commit is still in the history (adoption, fencing)
    assert sink_format.committed(None, sink, pipeline=PIPELINE, batch_id=1).record_count == 6
    assert report.snapshots_expired == 0 and report.files_deleted == 0
    assert all(os.path.exists(t.file.file_path.removeprefix("file:")) for t in table.scan().plan_files())


def test_expiry_drops_old_snapshots_and_deletes_only_files_nothing_references(tmp_path):
    sink_format = IcebergSink(f"sqlite:///{tmp_path}/catalog.db")
    sink = str(tmp_path / "events")
    appended(sink_format, sink, range(1, 6), 6)
    # an attempt whose job wrote its files and never committed (its worker died)
    stray = tmp_path / "events" / "data" / f"{BATCH_COLUMN}=6" / "1-dead" / "part-0.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"PAR1 never committed")
    kept_beside = tmp_path / "events" / "notes.txt"  # not the table's: in none of its folders
    kept_beside.write_text("a user's file beside the table's folders")
    before = sink_format.load(sink)
    snapshots_before, rows = len(before.snapshots()), ids(before)

    report = sink_format.maintain(sink, options(retention_s=0))

    table = sink_format.load(sink)
    assert ids(table) == rows
    assert not stray.exists() and kept_beside.exists()
    assert report.snapshots_expired == snapshots_before + 1 - len(table.snapshots()) > 0
    live = {t.file.file_path.removeprefix("file:") for t in table.scan().plan_files()}
    on_disk = {str(p) for p in (tmp_path / "events" / "data").rglob("*.parquet")}
    assert on_disk == live  # the 15 small files compaction replaced are gone, the merged ones stay
    assert report.files_deleted >= 15 + 1
    # the table still opens from a fresh catalog and reads every row (no referenced file deleted)
    fresh = IcebergSink(f"sqlite:///{tmp_path}/catalog.db").load(sink)
    assert ids(fresh) == rows


def test_a_replay_after_a_compaction_rewrites_only_its_batch(spark, tmp_path):
    """A batch's attempt 1 committed, another batch beside it, a compaction merges their files,
    then a failed attempt 2 of batch 1 writes files and dies before its commit, the maintenance
    runs again, and the replay (attempt 3) lands: batch 1's rows once, by attempt 3; batch 2's
    untouched; the commit's row count is the batch's, not the merged file's."""
    uri = f"sqlite:///{tmp_path}/catalog.db"
    sink = str(tmp_path / "events")
    sink_format = IcebergSink(uri)

    def write(batch_id: int, attempt: int, n: int = 30):
        return IcebergSink(uri).write_batch(
            spark,
            spark_rows(spark, batch_id, n, attempt),
            sink,
            pipeline=PIPELINE,
            batch_id=batch_id,
            attempt=attempt,
            ranges=(OffsetRange("orders", 0, batch_id * 1000, batch_id * 1000 + n),),
            expected_records=n,
            partition_by=DAY,
        )

    write(1, 1)
    write(2, 1)
    first = sink_format.maintain(sink, options(retention_s=3600))
    assert first.files_removed > 0 and max(p.files for p in first.after.values()) == 1
    # attempt 2 of batch 1: its files are written, then its worker dies before the commit
    dead = tmp_path / "events" / "data" / f"{BATCH_COLUMN}=1" / "2-dead"
    dead.mkdir(parents=True)
    (dead / "part-0.parquet").write_bytes(b"PAR1 never committed")
    sink_format.maintain(sink, options(retention_s=3600))
    assert (dead / "part-0.parquet").exists()  # younger than the retention: an attempt may be in flight
    commit = write(1, 3)
    assert (commit.attempt, commit.record_count) == (3, 30)
    table = sink_format.load(sink)
    read = table.scan().to_arrow()
    by_batch = Counter(zip(read.column(BATCH_COLUMN).to_pylist(), read.column("written_by").to_pylist()))
    assert by_batch == {(1, 3): 30, (2, 1): 30}
    assert ids(table) == Counter({(b, b * 1000 + i): 1 for b in (1, 2) for i in range(30)})


def test_a_batch_and_a_maintenance_racing_through_the_tables_lock_lose_and_repeat_nothing(spark, tmp_path):
    """Batches committed by the sink (Spark) under the ledger's lock of the table while maintenance
    runs, in a loop, under the same lock (as the ingest task and the maintenance task hold it): a
    maintenance run between every two batches (each waiting on the lock while a batch holds it),
    every row once."""
    from airflow_kafka_backpressure.config.pipeline import PipelineConfig
    from airflow_kafka_backpressure.ledger import Ledger
    from airflow_kafka_backpressure.operators.common import maintenance_lock, sink_commit_lock

    uri = f"sqlite:///{tmp_path}/catalog.db"
    sink = str(tmp_path / "events")
    p = PipelineConfig.from_dict(
        {
            "name": PIPELINE,
            "topics": ["orders"],
            "sink": sink,
            "sink_format": "iceberg",
            "sink_options": {"iceberg_catalog_uri": uri, "partition_by": "day(timestamp)"},
            "maintenance": {"retention_hours": 1},
        }
    )
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    done, runs, errors = threading.Event(), [], []

    def maintain() -> None:
        try:
            while not done.is_set():
                with maintenance_lock(p, ledger):
                    runs.append(IcebergSink(uri).maintain(sink, options(retention_s=0)))
                time.sleep(0.05)
        except Exception as e:  # the assertion below shows it
            errors.append(e)

    worker = threading.Thread(target=maintain, daemon=True)
    worker.start()
    try:
        for batch_id in range(1, 7):
            n = 20
            with sink_commit_lock(p, ledger, batch_id):
                IcebergSink(uri).write_batch(
                    spark,
                    spark_rows(spark, batch_id, n),
                    sink,
                    pipeline=PIPELINE,
                    batch_id=batch_id,
                    attempt=1,
                    ranges=(OffsetRange("orders", 0, batch_id * 1000, batch_id * 1000 + n),),
                    expected_records=n,
                    partition_by=DAY,
                )
            # the next batch waits for a maintenance run to take the lock in between (a lock is
            # not fair: the batch loop could take it back every time and nothing would interleave)
            before = len(runs)
            deadline = time.monotonic() + 60
            while len(runs) == before and not errors and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(runs) > before or errors, "no maintenance run between two batches in 60 s"
    finally:
        done.set()
        worker.join(120)
    assert not errors, errors
    assert len(runs) >= 6 and any(r.files_removed for r in runs)
    table = IcebergSink(uri).load(sink)
    assert ids(table) == Counter({(b, b * 1000 + i): 1 for b in range(1, 7) for i in range(20)})


def test_the_maintenance_dag_compacts_the_table_under_airflow(
    kafka_broker, topic_name, tmp_path, monkeypatch
):
    """The shipped DAG file's ``kbp_maintain_<name>`` for an Iceberg pipeline, run by ``dag.test()``:
    the task compacts the table and its XCom is the report."""
    af.reset_airflow_db()
    uri = f"sqlite:///{tmp_path}/catalog.db"
    sink = str(tmp_path / "events")
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)
    p, _ledger = make(
        sink=sink,
        sink_format="iceberg",
        sink_options={"iceberg_catalog_uri": uri, "partition_by": "day(timestamp)"},
        maintenance={"schedule": "@hourly", "retention_hours": 24, "target_file_mb": 64},
    )
    appended(IcebergSink(uri), sink, range(1, 5), 6)
    run = af.run_dag(p.maintain_dag_id, 0)
    assert run.state == "success", run.task_states
    (report,) = run.xcoms["maintain"]
    assert report["format"] == "iceberg" and report["files_removed"] == 12
    assert {part["files"] for part in report["after"].values()} == {1}
    kept = af.variable(p.maintenance_variable)  # what the monitoring page shows
    assert kept["tables"] == [report] and kept["run_id"] == run.run_id
    assert ids(IcebergSink(uri).load(sink)) == Counter(
        {(b, b * 1000 + i): 1 for b in range(1, 5) for i in range(6)}
    )
    assert af.load_dag(p.maintain_dag_id).tasks[0].execution_timeout.total_seconds() >= 3600


def test_on_s3_compaction_and_orphan_removal_go_through_the_object_store(
    tmp_path, s3_server, s3_bucket, monkeypatch
):
    """The same maintenance on a table in a bucket of the session's S3 server (``s3a://``, the
    store's AWS_* environment on the worker, as the Iceberg sink reads it): files listed, merged and
    deleted through the object store."""
    from pyarrow.fs import FileSelector

    for key, value in s3_server.aws_environment().items():
        monkeypatch.setenv(key, value)
    sink_format = IcebergSink(f"sqlite:///{tmp_path}/catalog.db")
    sink = f"s3a://{s3_bucket}/events"
    appended(sink_format, sink, range(1, 11), 6)
    stray = f"{s3_bucket}/events/data/{BATCH_COLUMN}=11/1-dead/part-0.parquet"
    fs = s3_server.filesystem()
    with fs.open_output_stream(stray) as f:
        f.write(b"PAR1 never committed")
    rows = ids(sink_format.load(sink))

    report = sink_format.maintain(sink, options(retention_s=0))

    table = sink_format.load(sink)
    assert ids(table) == rows and max(files_per_partition(table).values()) == 1
    assert report.files_removed == 30 and report.files_deleted >= 31
    listed = {
        i.path
        for i in fs.get_file_info(FileSelector(f"{s3_bucket}/events/data", recursive=True))
        if i.is_file
    }
    live = {t.file.file_path.split("://", 1)[1] for t in table.scan().plan_files()}
    assert listed == live
