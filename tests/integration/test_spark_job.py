"""The bounded Spark job against the real embedded broker and real Spark (local[2]).

Most batches run in the session's in-process SparkSession (``run_batch``); the production command
line (``spark-submit job.py --spec <hand-off URI>`` with the package zip on ``--py-files`` and the
sealed spec's key in the environment) runs twice: a successful re-run of a batch and an unreachable
broker. The sink is always checked by reading the
Parquet back with pyarrow, independently of the job.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from airflow_kafka_backpressure.batch import handoff
from airflow_kafka_backpressure.batch.models import BatchMetrics, BatchPlan, JobSpec, OffsetRange, batch_path
from airflow_kafka_backpressure.engines.submit import job_script_path, package_zip
from airflow_kafka_backpressure.sinks.parquet import commit as parquet_commit
from airflow_kafka_backpressure.sinks.parquet import manifest as parquet_manifest
from airflow_kafka_backpressure.sinks.parquet import write as parquet_write
from airflow_kafka_backpressure.spark.job import (
    METRICS_PREFIX,
    JobError,
    choose_reader,
    run_batch,
)
from airflow_kafka_backpressure.spark.kafka_range_source import (
    KAFKA_SCHEMA,
    SOURCE_NAME,
    KafkaRangeDataSource,
    KafkaRangeReadError,
    range_source_options,
    read_range,
)
from kbp_local.process import free_port
from kbp_local.producer import ensure_topic, produce

from .kafka_samples import produce_sample_records

PARTITIONS = 4


# --------------------------------------------------------------------------- helpers


def make_spec(
    tmp: Path,
    bootstrap: str,
    batch_id: int,
    ranges: dict[tuple[str, int], tuple[int, int]],
    *,
    sink: Path,
    transform: str | None = None,
    kafka: dict | None = None,
    options: dict | None = None,
) -> JobSpec:
    plan = BatchPlan(
        pipeline="test",
        batch_id=batch_id,
        run_id=f"run-{batch_id}",
        ranges=tuple(OffsetRange(t, p, a, b) for (t, p), (a, b) in ranges.items()),
        sink=str(sink),
        batch_interval_ms=10_000,
        planned_at_ms=int(time.time() * 1000),
    )
    return JobSpec(
        plan=plan,
        kafka=kafka or {"bootstrap.servers": bootstrap},
        launched_at_ms=int(time.time() * 1000),
        reader="auto",
        transform=transform,
        poll_timeout_ms=500,
        stall_timeout_s=20,
        options=options or {},
    )


def hand_off(spec: JobSpec, name: str):
    """The spec in a hand-off directory under the sink, as the submit engine writes it:
    ``(directory, spec URI, key)``."""
    directory = handoff.job_dir(spec.plan.sink, name)
    uri, key = handoff.write_spec(directory, spec)
    return directory, uri, key


def sink_table(sink: Path):
    """The whole sink, read independently of the job (pyarrow, Hive partitioning)."""
    return pads.dataset(str(sink), format="parquet", partitioning="hive").to_table()


def ids_of(table) -> list[int]:
    return [json.loads(v)["id"] for v in table.column("value").to_pylist()]


def expected_counts(spec: JobSpec) -> dict[tuple[str, int], int]:
    # These topics have no offset gaps (no transactions, no compaction): records per range = offsets per range.
    return {(r.topic, r.partition): r.count for r in spec.plan.ranges}


def metric_counts(m: BatchMetrics) -> dict[tuple[str, int], int]:
    return {(p.topic, p.partition): p.records for p in m.partitions}


def assert_metrics_match(m: BatchMetrics, spec: JobSpec, executors: int = 1) -> None:
    assert m.batch_id == spec.plan.batch_id
    assert metric_counts(m) == expected_counts(spec)
    assert m.records == sum(expected_counts(spec).values())
    assert m.launched_at_ms == spec.launched_at_ms
    assert m.launched_at_ms <= m.read_started_at_ms <= m.committed_at_ms
    assert m.executors == executors  # local mode: 1 when any task ran


@pytest.fixture
def topic4(kafka_broker, topic_name):
    ensure_topic(kafka_broker.bootstrap, topic_name, PARTITIONS)
    return topic_name


@pytest.fixture
def sink(tmp_path) -> Path:
    return tmp_path / "sink"


# --------------------------------------------------------------------------- the acceptance flow


@pytest.mark.parametrize("writer", ["spark", "arrow"])
def test_three_batches_and_a_rerun_hold_every_record_exactly_once(
    spark, spark_submit, kafka_broker, topic4, sink, tmp_path, writer
):
    """With either writer (``arrow``: the reading tasks write the files, :mod:`.spark.arrow_writer`)."""
    bootstrap, t = kafka_broker.bootstrap, topic4
    produced = produce(bootstrap, t, count=80, partitions=PARTITIONS)  # ids 0..79, 20 per partition
    # small pieces: a range is read and written by several tasks
    options = {"writer": writer, "max_records_per_partition": 7}

    plans = {
        0: {(t, 0): (0, 10), (t, 1): (0, 5), (t, 2): (0, 0), (t, 3): (0, 12)},
        1: {(t, 0): (10, 20), (t, 1): (5, 20), (t, 2): (0, 15), (t, 3): (12, 12)},
    }
    specs = {b: make_spec(tmp_path, bootstrap, b, r, sink=sink, options=options) for b, r in plans.items()}
    for b in (0, 1):
        assert_metrics_match(run_batch(spark, specs[b]), specs[b])

    produced += produce(bootstrap, t, count=80, partitions=PARTITIONS, start_id=80)  # 40 per partition
    plans[2] = {(t, 0): (20, 40), (t, 1): (20, 40), (t, 2): (15, 40), (t, 3): (12, 40)}
    specs[2] = make_spec(tmp_path, bootstrap, 2, plans[2], sink=sink, options=options)
    group = f"kbp-acceptance-{writer}"
    spark.sparkContext.setJobGroup(group, "batch 2")
    try:
        assert_metrics_match(run_batch(spark, specs[2]), specs[2])
    finally:
        spark.sparkContext.setJobGroup(None, None)
    manifest = parquet_manifest.read_manifest(str(sink), 2)
    assert manifest.get("writer", "spark") == writer
    if writer == "arrow":  # one file per piece: 20 + 20 + 25 + 28 offsets in pieces of at most 7
        assert len(manifest["files"]) == 3 + 3 + 4 + 4
        # ... written by one task per slot of local[2], not one per piece
        tracker = spark.sparkContext.statusTracker()
        stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
        assert [tracker.getStageInfo(s).numTasks for s in stages] == [2]

    # Re-run batch 1 through the production command line, with the package shipped as a zip.
    rerun = make_spec(tmp_path, bootstrap, 1, plans[1], sink=sink, options=options)
    job, spec_uri, key = hand_off(rerun, "rerun-1")
    sealed = (Path(job.path) / handoff.SPEC_NAME).read_text()
    assert bootstrap not in sealed  # the Kafka properties are sealed in the file
    zip_path = package_zip(tmp_path / "dist")
    started = time.monotonic()
    proc = spark_submit(
        job_script_path(), "--spec", spec_uri, py_files=[zip_path], env={handoff.SPEC_KEY_ENV: key}
    )
    submit_s = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(METRICS_PREFIX)]
    assert len(lines) == 1, proc.stdout
    printed = BatchMetrics.from_dict(json.loads(lines[0][len(METRICS_PREFIX) :]))
    assert_metrics_match(printed, rerun)
    assert handoff.read_result(job) == printed  # handed back through the directory, too
    assert not (Path(job.path) / handoff.SPEC_NAME).exists()  # the driver took the spec away
    job.delete()
    print(f"spark-submit re-run of batch 1: {submit_s:.1f}s wall")  # informational only

    # Every produced record exactly once, read back independently of the job.
    table = sink_table(sink)
    assert sorted(ids_of(table)) == list(range(produced))
    assert Counter(ids_of(table)) == Counter(range(produced))
    keys = list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist()))
    assert len(keys) == len(set(keys))
    per_batch = Counter(table.column("batch_id").to_pylist())
    assert per_batch == {b: sum(c for _, c in expected_counts(specs[b]).items()) for b in (0, 1, 2)}
    # id i went to partition i % 4 as the (i // 4)-th record there.
    for pid, p, off in zip(
        ids_of(table), table.column("partition").to_pylist(), table.column("offset").to_pylist()
    ):
        assert (p, off) == (pid % PARTITIONS, pid // PARTITIONS)

    # Spark reads the sink root the same way.
    assert spark.read.parquet(str(sink)).count() == produced

    # The manifest describes the committed re-run; nothing temporary is left.
    manifest = parquet_manifest.read_manifest(str(sink), 1)
    assert manifest["records"] == sum(expected_counts(rerun).values())
    assert manifest["ranges"] == [r.to_dict() for r in rerun.plan.ranges]
    assert {(p["topic"], p["partition"]): p["records"] for p in manifest["partitions"]} == expected_counts(
        rerun
    )
    assert manifest["files"] and all(f["bytes"] > 0 for f in manifest["files"])
    assert manifest["executors"] == 1 and manifest["unread"] == [] and manifest["token"] == rerun.token
    assert parquet_commit.leftovers(str(sink), 1) == []
    assert sorted(p.name for p in sink.iterdir() if p.name != "_kbp") == [
        "batch_id=0",
        "batch_id=1",
        "batch_id=2",
    ]
    assert list((sink / "_kbp" / "jobs").iterdir()) == []


def test_the_arrow_writer_writes_what_the_spark_writer_writes(spark, kafka_broker, topic4, sink, tmp_path):
    """Same records, same Spark schema, same sink settings (no dictionary for key, value, offset);
    an empty batch still commits a schema-only file; a transform is refused."""
    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=40, partitions=PARTITIONS)
    ranges = {(t, p): (0, 10) for p in range(PARTITIONS)}
    for batch_id, writer in ((0, "spark"), (1, "arrow")):
        spec = make_spec(tmp_path, bootstrap, batch_id, ranges, sink=sink, options={"writer": writer})
        assert_metrics_match(run_batch(spark, spec), spec)
    by_spark, by_arrow = (spark.read.parquet(str(sink / f"batch_id={b}")) for b in (0, 1))
    assert by_arrow.schema == by_spark.schema
    columns = [c for c in by_spark.columns if c != "timestamp"]  # produce() stamps each record itself
    assert sorted(by_arrow.select(columns).collect()) == sorted(by_spark.select(columns).collect())
    encoded = _dictionary_encoded(sink / "batch_id=1")
    assert not (encoded["key"] or encoded["value"] or encoded["offset"]) and encoded["topic"], encoded

    empty = make_spec(
        tmp_path,
        bootstrap,
        2,
        {(t, p): (10, 10) for p in range(PARTITIONS)},
        sink=sink,
        options={"writer": "arrow"},
    )
    assert run_batch(spark, empty).records == 0
    assert spark.read.parquet(str(sink / "batch_id=2")).schema == by_spark.schema

    with pytest.raises(JobError, match="writer 'arrow' .* takes no transform"):
        run_batch(
            spark,
            make_spec(
                tmp_path,
                bootstrap,
                3,
                ranges,
                sink=sink,
                transform="tests.integration.spark_transforms:even_ids",
                options={"writer": "arrow"},
            ),
        )


@pytest.mark.parametrize("writer", ["spark", "auto"])
def test_all_empty_batch_commits_an_empty_directory_readers_accept(
    spark, kafka_broker, topic4, sink, tmp_path, writer
):
    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=8, partitions=PARTITIONS)
    opts = {"writer": writer}
    full = make_spec(
        tmp_path, bootstrap, 0, {(t, p): (0, 2) for p in range(PARTITIONS)}, sink=sink, options=opts
    )
    run_batch(spark, full)
    empty = make_spec(
        tmp_path, bootstrap, 1, {(t, p): (2, 2) for p in range(PARTITIONS)}, sink=sink, options=opts
    )
    m = run_batch(spark, empty)
    # nothing to read: no Spark job runs with either writer, the driver writes the schema-only file
    assert_metrics_match(m, empty, executors=0)
    assert m.records == 0 and m.bytes == 0

    manifest = json.loads((sink / "batch_id=1" / parquet_manifest.MANIFEST_NAME).read_text())
    assert manifest["records"] == 0 and manifest["batch_id"] == 1
    table = sink_table(sink)
    assert sorted(ids_of(table)) == list(range(8))
    assert set(table.column("batch_id").to_pylist()) == {0}
    assert spark.read.parquet(str(sink)).count() == 8
    # The empty batch has the same columns as a full one.
    assert (
        spark.read.parquet(str(sink / "batch_id=1")).schema
        == spark.read.parquet(str(sink / "batch_id=0")).schema
    )

    no_ranges = make_spec(tmp_path, bootstrap, 2, {}, sink=sink, options=opts)
    assert run_batch(spark, no_ranges).records == 0
    assert (sink / "batch_id=2" / parquet_manifest.MANIFEST_NAME).exists()
    assert sink_table(sink).num_rows == 8


# --------------------------------------------------------------------------- errors


def test_range_past_latest_is_a_clear_error_and_writes_nothing(spark, kafka_broker, topic4, sink, tmp_path):
    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=8, partitions=PARTITIONS)  # latest = 2 everywhere
    spec = make_spec(tmp_path, bootstrap, 5, {(t, 0): (0, 2), (t, 1): (1, 7)}, sink=sink)
    with pytest.raises(JobError) as err:
        run_batch(spark, spec)
    msg = str(err.value)
    assert f"{t}-1[1, 7)" in msg and "latest offset 2" in msg and "re-plan" in msg
    assert f"{t}-0" not in msg.replace(f"{t}-1", "")  # only the bad range is blamed
    assert not Path(batch_path(str(sink), 5)).exists()
    assert not sink.exists() or not [p for p in sink.iterdir() if not p.name.startswith(".")]


def test_a_range_past_latest_fails_a_connect_engine_batch_the_same_way_and_writes_nothing(
    spark_connect, kafka_broker, topic4, sink, tmp_path
):
    """The connect engine checks the ranges while its client session opens (spark.bounds.started_check):
    the answer still stops the batch before anything is read or staged, with the same message."""
    from airflow_kafka_backpressure.engines import BatchJobError
    from airflow_kafka_backpressure.engines.connect import ConnectEngine

    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=8, partitions=PARTITIONS)  # latest = 2 everywhere
    spec = make_spec(tmp_path, bootstrap, 5, {(t, 0): (0, 2), (t, 1): (1, 7)}, sink=sink)
    with pytest.raises(BatchJobError) as err:
        ConnectEngine(spark_connect.url, work_root=tmp_path / "work").run(spec)
    msg = str(err.value)
    assert f"{t}-1[1, 7)" in msg and "latest offset 2" in msg and "re-plan" in msg
    assert not Path(batch_path(str(sink), 5)).exists()
    assert not sink.exists() or not list(sink.iterdir())  # not even a fence or a staging folder


def test_missing_topic_is_a_clear_error_and_is_not_created(spark, kafka_broker, sink, tmp_path, topic_name):
    from kafka import KafkaAdminClient

    missing = f"{topic_name}-missing"
    spec = make_spec(tmp_path, kafka_broker.bootstrap, 0, {(missing, 0): (0, 5)}, sink=sink)
    with pytest.raises(JobError, match=f"topic '{missing}' does not exist"):
        run_batch(spark, spec)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert missing not in admin.list_topics()
    finally:
        admin.close()
    assert not sink.exists()


def test_missing_partition_is_a_clear_error(spark, kafka_broker, topic4, sink, tmp_path):
    spec = make_spec(tmp_path, kafka_broker.bootstrap, 0, {(topic4, 9): (0, 1)}, sink=sink)
    with pytest.raises(JobError, match=r"has no partition 9 \(it has \[0, 1, 2, 3\]\)"):
        run_batch(spark, spec)


def test_unreachable_broker_fails_the_submitted_job_with_a_clear_error(spark_submit, tmp_path, sink):
    dead = f"127.0.0.1:{free_port()}"
    kafka = {"bootstrap.servers": dead, "socket.connection.setup.timeout.ms": "2000"}
    spec = make_spec(tmp_path, dead, 0, {("t", 0): (0, 5)}, sink=sink, kafka=kafka)
    job, spec_uri, key = hand_off(spec, "unreachable")
    proc = spark_submit(job_script_path(), "--spec", spec_uri, env={handoff.SPEC_KEY_ENV: key})
    output = proc.stdout + proc.stderr  # spark-submit merges the Python driver's stderr into stdout
    assert proc.returncode == 1, output[-4000:]
    errors = [line for line in output.splitlines() if line.startswith("KBP_ERROR ")]
    assert errors and f"cannot reach Kafka at '{dead}'" in errors[0], output[-4000:]
    assert METRICS_PREFIX not in proc.stdout
    result = handoff.read_result(job)  # the error comes back through the hand-off directory
    assert isinstance(result, str) and f"cannot reach Kafka at '{dead}'" in result
    assert sorted(p.name for p in sink.iterdir()) == ["_kbp"]  # no batch, no staging


def test_bad_spec_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"plan": {}}')
    from airflow_kafka_backpressure.spark.job import main

    assert main(["--spec", str(bad)]) == 2
    assert main(["--spec", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    spec = make_spec(tmp_path, "127.0.0.1:1", 0, {("t", 0): (0, 5)}, sink=tmp_path / "sink")
    _, uri, _key = hand_off(spec, "no-key")
    assert main(["--spec", uri]) == 2  # sealed, and no key in the environment
    assert handoff.SPEC_KEY_ENV in capsys.readouterr().err


# --------------------------------------------------------------------------- transform


def test_transform_is_applied_and_metrics_count_what_was_read(spark, kafka_broker, topic4, sink, tmp_path):
    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=40, partitions=PARTITIONS)
    ranges = {(t, p): (0, 10) for p in range(PARTITIONS)}
    spec = make_spec(
        tmp_path, bootstrap, 0, ranges, sink=sink, transform="tests.integration.spark_transforms:even_ids"
    )
    m = run_batch(spark, spec)
    assert_metrics_match(m, spec)  # all 40 read, though only 20 are written
    table = sink_table(sink)
    assert "headers" not in table.column_names
    assert sorted(table.column("id").to_pylist()) == list(range(0, 40, 2))
    assert sorted(ids_of(table)) == list(range(0, 40, 2))


def test_transform_ignoring_its_input_still_gets_counts(spark, kafka_broker, topic4, sink, tmp_path):
    bootstrap, t = kafka_broker.bootstrap, topic4
    produce(bootstrap, t, count=12, partitions=PARTITIONS)
    spec = make_spec(
        tmp_path,
        bootstrap,
        0,
        {(t, p): (0, 3) for p in range(PARTITIONS)},
        sink=sink,
        transform="tests.integration.spark_transforms:unrelated",
    )
    assert_metrics_match(run_batch(spark, spec), spec)
    assert sink_table(sink).num_rows == 3
    # the write read nothing: the manifest says so, and the job counted with a second read
    assert len(parquet_manifest.read_manifest(str(sink), 0)["unread"]) == PARTITIONS


@pytest.mark.parametrize(
    "transform, message",
    [
        ("tests.integration.no_such_module:fn", "cannot import module 'tests.integration.no_such_module'"),
        ("tests.integration.spark_transforms:missing", "has no attribute 'missing'"),
        ("tests.integration.spark_transforms:NOT_CALLABLE", "not a function"),
        ("tests.integration.spark_transforms:not_a_dataframe", "returned int, not a DataFrame"),
    ],
)
def test_bad_transform_is_a_clear_error(spark, kafka_broker, topic4, sink, tmp_path, transform, message):
    produce(kafka_broker.bootstrap, topic4, count=4, partitions=PARTITIONS)
    spec = make_spec(
        tmp_path, kafka_broker.bootstrap, 0, {(topic4, 0): (0, 1)}, sink=sink, transform=transform
    )
    with pytest.raises(JobError, match=message):
        run_batch(spark, spec)
    assert not Path(batch_path(str(sink), 0)).exists()


# --------------------------------------------------------------------------- the reader


def test_reader_auto_picks_the_native_reader_with_the_connector(spark, tmp_path):
    # the session's SPARK_CONF_DIR puts Spark's Kafka connector on the classpath (tests/conftest.py)
    spec = make_spec(tmp_path, "h:1", 1, {("t", 0): (0, 1)}, sink=tmp_path / "sink")

    def chosen(reader: str, **changes) -> str:
        return choose_reader(spark, JobSpec.from_dict({**spec.to_dict(), "reader": reader, **changes})).name

    assert chosen("auto") == "native" and chosen("native") == "native" and chosen("python") == "python"
    # credentials in a Spark Connect session's file: Spark's connector cannot read them
    assert chosen("auto", secrets_file="kbp-kafka-credentials.json") == "python"


def test_the_native_reader_scans_through_the_connectors_v2_source(spark, kafka_broker, topic_name, tmp_path):
    """Spark reads format("kafka") through its V1 relation by default (rows converted to external
    Row objects and back); the batch's read goes through the connector's V2 scan, the same records,
    and the session's other V1 sources keep their setting."""
    from airflow_kafka_backpressure.spark.native_reader import V1_SOURCES_CONF
    from airflow_kafka_backpressure.spark.readers import read_ranges, reader_for

    bootstrap = kafka_broker.bootstrap
    ensure_topic(bootstrap, topic_name, 1)
    produce_sample_records(bootstrap, topic_name)
    before = spark.conf.get(V1_SOURCES_CONF)
    spark.conf.set(V1_SOURCES_CONF, "avro,csv,KAFKA,parquet")
    try:
        spec = make_spec(tmp_path, bootstrap, 1, {(topic_name, 0): (0, 3)}, sink=tmp_path / "sink")
        df = read_ranges(spark, spec, reader_for("native"))
        assert spark.conf.get(V1_SOURCES_CONF) == "avro,csv,parquet"
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "BatchScan" in plan and "KafkaRelation" not in plan, plan
        rows = sorted(df.collect(), key=lambda r: r["offset"])
        assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
            (0, b"k0", b"v0"),
            (1, None, b"v1"),
            (2, b"k2", None),
        ]
        assert [(h["key"], h["value"]) for h in rows[1]["headers"]] == [("h", b"x"), ("e", b"")]
    finally:
        spark.conf.set(V1_SOURCES_CONF, before)


def test_data_source_yields_the_kafka_source_schema_and_values(spark, kafka_broker, topic_name):
    bootstrap = kafka_broker.bootstrap
    ensure_topic(bootstrap, topic_name, 1)
    produce_sample_records(bootstrap, topic_name)

    spark.dataSource.register(KafkaRangeDataSource)
    opts = range_source_options([OffsetRange(topic_name, 0, 0, 3)], {"bootstrap.servers": bootstrap})
    df = spark.read.format(SOURCE_NAME).options(**opts).load()
    assert df.schema == KAFKA_SCHEMA
    rows = sorted(df.collect(), key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == [0, 1, 2]  # offset 3 is past until
    assert [r["key"] for r in rows] == [b"k0", None, b"k2"]
    assert [r["value"] for r in rows] == [b"v0", b"v1", None]
    assert {r["topic"] for r in rows} == {topic_name} and {r["partition"] for r in rows} == {0}
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [
        1_700_000_000_123,
        1_700_000_000_456,
        1_700_000_000_789,
    ]
    assert [r["timestampType"] for r in rows] == [0, 0, 0]
    assert rows[0]["headers"] is None  # as Spark's Kafka source: no headers -> null
    assert [(h["key"], h["value"]) for h in rows[1]["headers"]] == [("h", b"x"), ("e", b"")]


def test_read_range_reads_exactly_and_stalls_with_a_clear_error(kafka_broker, topic4):
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topic4, count=20, partitions=PARTITIONS)  # 5 per partition
    props = {"bootstrap.servers": bootstrap}
    batches = list(read_range(OffsetRange(topic4, 2, 1, 4), props, max_records_per_batch=2))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == [1, 2, 3] and [b.num_rows for b in batches] == [2, 1]
    assert [json.loads(v)["id"] for b in batches for v in b.column("value").to_pylist()] == [6, 10, 14]

    with pytest.raises(KafkaRangeReadError) as err:
        list(read_range(OffsetRange(topic4, 1, 3, 9), props, poll_timeout_ms=200, stall_timeout_s=1))
    msg = str(err.value)
    assert f"{topic4}-1[3, 9)" in msg and "position 5" in msg and "stalled" in msg


@pytest.mark.parametrize("writer,reader", [("spark", "python"), ("arrow", "python"), ("spark", "native")])
def test_stalled_read_fails_the_job_with_the_range_named(
    spark, kafka_broker, topic4, sink, tmp_path, monkeypatch, writer, reader
):
    """The bounds check normally prevents this; bypass it to see the executor's error surface."""
    from airflow_kafka_backpressure.spark import job

    produce(kafka_broker.bootstrap, topic4, count=4, partitions=PARTITIONS)  # 1 per partition
    spec = make_spec(
        tmp_path, kafka_broker.bootstrap, 0, {(topic4, 0): (0, 3)}, sink=sink, options={"writer": writer}
    )
    spec = JobSpec.from_dict(
        {**spec.to_dict(), "stall_timeout_s": 1, "poll_timeout_ms": 200, "reader": reader}
    )
    monkeypatch.setattr(job, "check_bounds", lambda s: {})
    with pytest.raises(JobError) as err:
        run_batch(spark, spec)
    if reader == "python":
        assert f"reading {topic4}-0[0, 3) stalled" in str(err.value)
    else:  # Spark's reader: Kafka answers the fetch at offset 1, past the end, with OffsetOutOfRange
        assert f"failed while reading {topic4}-0[0, 3) (reader=native)" in str(err.value)
        assert (
            f"OffsetOutOfRangeException: Offsets out of range with no configured reset policy for partitions: {{{topic4}-0=1}}"
            in str(err.value)
        )
    assert not Path(batch_path(str(sink), 0)).exists()
    assert parquet_commit.leftovers(str(sink), 0) == []  # the failed write removed its staging dir


# --------------------------------------------------------------------------- the sink


def _rows(spark, ids):
    return spark.createDataFrame([(i, f"r{i}") for i in ids], "id long, name string")


def test_sink_ignores_and_cleans_crash_leftovers(spark, sink):
    root = str(sink)
    parquet_write.write_batch(spark, _rows(spark, range(5)), root, 1, describe={"pipeline": "p"})
    parquet_write.write_batch(spark, _rows(spark, range(5, 8)), root, 7, describe={"pipeline": "p"})
    # What crashes leave behind: a finished staging dir, a replaced version (both full copies).
    for name in ("_kbp_staging_1_dead", "_kbp_replaced_1_dead", "_kbp_staging_7_dead"):
        shutil.copytree(sink / "batch_id=1", sink / name)
    assert sorted(sink_table(sink).column("id").to_pylist()) == list(range(8))
    assert spark.read.parquet(root).count() == 8

    manifest = parquet_write.write_batch(spark, _rows(spark, range(5)), root, 1, describe={"pipeline": "p"})
    assert manifest["batch_id"] == 1 and manifest["rows"] == 5
    assert parquet_commit.leftovers(root, 1) == []
    assert parquet_commit.leftovers(root, 7) == ["_kbp_staging_7_dead"]  # other batches' are theirs
    assert spark.read.parquet(root).count() == 8


def _dictionary_encoded(path: Path) -> dict[str, bool]:
    """Per column of the batch's Parquet files: did the writer dictionary-encode it?"""
    import pyarrow.parquet as pq

    out: dict[str, bool] = {}
    for f in sorted(path.glob("*.parquet")):
        md = pq.ParquetFile(f).metadata
        for g in range(md.num_row_groups):
            for i in range(md.num_columns):
                c = md.row_group(g).column(i)
                used = any("DICTIONARY" in e for e in c.encodings)
                out[c.path_in_schema] = out.get(c.path_in_schema, False) or used
    return out


def test_sink_writes_kafka_key_value_and_offset_without_dictionary_encoding(spark, sink):
    """Few distinct values, so Parquet would keep a dictionary for every column: the default leaves
    ``key``, ``value`` and ``offset`` plain (see ``PLAIN_COLUMNS``), ``plain_columns=()`` does not."""
    df = spark.createDataFrame(
        [(f"k{i % 3}".encode(), f"v{i % 2}".encode(), "t", i % 5, "x") for i in range(200)],
        "key binary, value binary, topic string, offset long, other string",
    )
    parquet_write.write_batch(spark, df, str(sink), 1, describe={"pipeline": "p"})
    assert _dictionary_encoded(sink / "batch_id=1") == {
        "key": False,
        "value": False,
        "topic": True,
        "offset": False,
        "other": True,
    }
    parquet_write.write_batch(
        spark, df, str(sink), 2, describe={"pipeline": "p"}, plain_columns="other, value"
    )
    assert _dictionary_encoded(sink / "batch_id=2") == {
        "key": True,
        "value": False,
        "topic": True,
        "offset": True,
        "other": False,
    }
    parquet_write.write_batch(spark, df, str(sink), 3, describe={"pipeline": "p"}, plain_columns=())
    assert all(_dictionary_encoded(sink / "batch_id=3").values())
    assert sorted(sink_table(sink).column("offset").to_pylist()) == sorted(3 * [i % 5 for i in range(200)])


def test_sink_converges_after_a_crash_between_the_two_renames(spark, sink):
    root = str(sink)
    parquet_write.write_batch(spark, _rows(spark, range(4)), root, 3, describe={"pipeline": "p"})
    # Crash after "batch_id=3 -> _kbp_replaced_3_x" and before "staging -> batch_id=3".
    shutil.copytree(sink / "batch_id=3", sink / "_kbp_staging_3_x")
    (sink / "batch_id=3").rename(sink / "_kbp_replaced_3_x")
    parquet_write.write_batch(spark, _rows(spark, range(4)), root, 3, describe={"pipeline": "p"})
    assert sorted(r["id"] for r in spark.read.parquet(root).collect()) == [0, 1, 2, 3]
    assert parquet_commit.leftovers(root, 3) == []
    assert parquet_manifest.read_manifest(root, 3)["batch_id"] == 3
    assert parquet_manifest.read_manifest(root, 4) is None


def test_sink_refuses_to_overwrite_another_pipelines_batch(spark, sink):
    root = str(sink)
    mine = (OffsetRange("t", 0, 0, 4),)
    parquet_write.write_batch(spark, _rows(spark, range(4)), root, 1, mine, {"pipeline": "orders"})
    # the same pipeline and ranges: replaced (a retry, a rerun, a replay)
    parquet_write.write_batch(spark, _rows(spark, range(4)), root, 1, mine, {"pipeline": "orders"})
    # another pipeline sharing the sink, or a reset ledger that reuses batch ids: refused, each
    # with its own cause named
    for ranges, pipeline, cause in (
        (mine, "payments", "two pipelines share this sink"),
        ((OffsetRange("t", 0, 4, 9),), "orders", "the ledger was reset"),
    ):
        with pytest.raises(Exception, match=cause):
            parquet_write.write_batch(
                spark, _rows(spark, range(100, 105)), root, 1, ranges, {"pipeline": pipeline}
            )
    assert sorted(sink_table(sink).column("id").to_pylist()) == [0, 1, 2, 3]
    assert parquet_commit.leftovers(root, 1) == []  # the refused attempt cleaned its staging directory
