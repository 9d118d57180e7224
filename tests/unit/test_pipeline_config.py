"""The pipelines file is validated before any DAG is built: every field's JSON type, every timing
field's range and the timing fields against each other, the sink's form — each refusal names the
file, the pipeline, the key, the value and the fix."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

BASE = {"name": "orders", "topics": ["orders"], "sink": "/data/orders"}


def load(**overrides):
    return PipelineConfig.load_all(
        json.dumps({"pipelines": [{**BASE, **overrides}]}), source="pipelines.json"
    )


def test_a_valid_file_loads_with_the_defaults():
    (p,) = load(batch_interval_s=30, stale_after_s=7200, replay_interval_s=60)
    assert p.topics == ("orders",) and p.stale_after_s == 7200.0 and p.kafka_timeout_s == 30.0
    assert p.ledger_keep_losses_days is None  # recorded losses are kept unless told otherwise
    (q,) = load(ledger_keep_losses_days=90)
    assert q.ledger_keep_losses_days == 90 and q.to_dict()["ledger_keep_losses_days"] == 90


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        # field types
        ({"batch_interval_s": "60"}, ["batch_interval_s", "'60'", "a number"]),
        ({"stale_after_s": "1d"}, ["stale_after_s", "'1d'", "a number or null"]),
        ({"stall_timeout_s": True}, ["stall_timeout_s", "True", "a number"]),
        ({"replay_interval_s": [60]}, ["replay_interval_s", "a number or null"]),
        ({"executor_cores": 1.5}, ["executor_cores", "an integer"]),
        ({"replay_deferrable": "yes"}, ["replay_deferrable", "true/false"]),
        ({"topics": ["a", 3]}, ["topics", "a list of strings"]),
        ({"spark_conf": {"spark.executor.cores": 2}}, ["spark_conf", "an object of strings"]),
        ({"kafka_timeout_s": None}, ["kafka_timeout_s", "a number"]),
        # ranges
        ({"stall_timeout_s": 0}, ["stall_timeout_s", "> 0"]),
        ({"stale_after_s": -5}, ["stale_after_s", "> 0"]),
        ({"replay_interval_s": 0}, ["replay_interval_s", "> 0"]),
        ({"replay_interval_s": 0.2}, ["replay_interval_s", "at least 1 s"]),
        ({"batch_interval_s": 0.01}, ["batch_interval_s", "at least 1 s"]),
        ({"task_timeout_s": 0}, ["task_timeout_s", "> 0"]),
        # recorded losses' own retention (issue 39, item 8)
        ({"ledger_keep_losses_days": 0}, ["ledger_keep_losses_days", "> 0", "keep every recorded loss"]),
        ({"ledger_keep_losses_days": "30"}, ["ledger_keep_losses_days", "a number or null"]),
        # timing rules between fields
        (
            {"stall_timeout_s": 900},
            ["stall_timeout_s", "shorter than the batch timeout (600 s", "batch_timeout_s"],
        ),
        ({"stall_timeout_s": 60, "batch_timeout_s": 60}, ["stall_timeout_s", "(60 s"]),
        (
            {"stale_after_s": 300},
            ["stale_after_s", "longer than the batch timeout (600 s", "replayed while it writes"],
        ),
        ({"stale_after_s": 3600, "batch_interval_s": 1200}, ["stale_after_s", "(6000 s"]),
        # sink
        ({"sink": "data/orders"}, ["sink", "'data/orders'", "absolute path or a URI"]),
        ({"sink": "./out"}, ["sink", "absolute path"]),
        ({"sink": ""}, ["sink", "give a path"]),
        # the writer
        (
            {"sink_options": {"writer": "pandas"}},
            ["sink_options.writer", "'pandas'", "one of auto, spark, arrow"],
        ),
        (
            {"sink_options": {"writer": "arrow"}, "transform": "m:f"},
            ["sink_options.writer", "remove the transform"],
        ),
        (
            {"sink_options": {"writer": "arrow"}, "reader": "native"},
            ["sink_options.writer", "reader 'auto' or 'python'"],
        ),
        # typed reader and sink options
        (
            {"reader_options": {"max_record_per_partition": 10}},
            ["reader_options: unknown key(s) ['max_record_per_partition']", "max_records_per_partition"],
        ),
        (
            {"reader_options": {"client": "librdkafka"}},
            ["reader_options.client", "auto, confluent, kafka-python"],
        ),
        ({"reader_options": {"arrow_batch_rows": 0}}, ["reader_options.arrow_batch_rows", ">= 1"]),
        ({"reader_options": {"max_records_per_partition": "10"}}, ["max_records_per_partition", "integer"]),
        ({"reader_options": ["client"]}, ["reader_options must be a JSON object"]),
        ({"sink_options": {"parquet_compression": "lzma"}}, ["sink_options.parquet_compression", "zstd"]),
        (
            {"sink_options": {"parquet_plain_columns": "key"}},
            ["sink_options.parquet_plain_columns", "a list"],
        ),
        (
            {"sink_options": {"compression": "zstd"}},
            ["unknown key(s) ['compression']", "parquet_compression"],
        ),
        (
            {"reader_options": {"writer": "spark"}, "sink_options": {"writer": "arrow"}},
            ["['writer'] given both in reader_options and in sink_options"],
        ),
    ],
)
def test_invalid_fields_are_refused_with_file_pipeline_key_and_value(overrides, fragments):
    with pytest.raises(ValueError) as e:
        load(**overrides)
    message = str(e.value)
    assert message.startswith("pipelines.json: pipeline #1: pipeline 'orders':"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_nan_from_the_json_file_is_refused():
    text = '{"pipelines": [{"name": "orders", "topics": ["orders"], "sink": "/d", "stale_after_s": NaN}]}'
    with pytest.raises(ValueError, match="stale_after_s = nan is invalid: must be a finite number"):
        PipelineConfig.load_all(text, source="pipelines.json")


def test_a_timing_that_fits_the_rules_is_accepted():
    (p,) = load(batch_timeout_s=120, stall_timeout_s=119, stale_after_s=121)
    assert p.batch_timeout == 120.0


@pytest.mark.parametrize(
    "item, fragments",
    [
        ("orders", ["pipeline #2", "JSON object", "str"]),
        ({"name": "b", "sink": "/d"}, ["pipeline #2", "pipeline 'b'", "required key(s) ['topics']"]),
        (
            {**BASE, "name": "b", "stale_after": 5},
            ["pipeline #2", "unknown key(s) ['stale_after']", "stale_after_s"],
        ),
    ],
)
def test_malformed_entries_name_their_position(item, fragments):
    text = json.dumps([{**BASE}, item])
    with pytest.raises(ValueError) as e:
        PipelineConfig.load_all(text, source="pipelines.json")
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))


@pytest.mark.parametrize(
    "second, fragments",
    [
        ({"sink": "/data/orders/"}, ["pipelines 'orders' and 'b' write the same sink"]),
        (
            {"sink": "/data/orders/late"},
            ["pipeline 'b''s sink '/data/orders/late' is inside pipeline 'orders''s sink"],
        ),
        (
            {"sink": "/data/b", "group_id": "kbp-orders"},
            ["pipelines 'orders' and 'b' commit the same consumer group 'kbp-orders'"],
        ),
    ],
)
def test_pipelines_that_would_mix_batches_or_commits_are_refused_naming_both(second, fragments):
    text = json.dumps([{**BASE, "sink": "/data/orders"}, {**BASE, "name": "b", **second}])
    with pytest.raises(ValueError) as e:
        PipelineConfig.load_all(text, source="pipelines.json")
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))


def test_a_symlink_to_another_pipelines_sink_is_the_same_sink(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    text = json.dumps(
        [{**BASE, "sink": str(tmp_path / "real")}, {**BASE, "name": "b", "sink": str(tmp_path / "link")}]
    )
    with pytest.raises(ValueError, match="pipelines 'orders' and 'b' write the same sink"):
        PipelineConfig.load_all(text, source="pipelines.json")


def test_object_store_sinks_compare_by_bucket_and_prefix():
    ok = [{**BASE, "sink": "s3://bucket/orders"}, {**BASE, "name": "b", "sink": "s3://bucket/orders-b"}]
    assert len(PipelineConfig.load_all(json.dumps(ok))) == 2
    same = [{**BASE, "sink": "s3://bucket/orders"}, {**BASE, "name": "b", "sink": "s3a://bucket/orders/"}]
    with pytest.raises(ValueError, match="write the same sink"):
        PipelineConfig.load_all(json.dumps(same))


def test_sink_format_is_parquet_delta_or_iceberg_and_tables_take_no_arrow_writer():
    (p,) = load()
    assert p.sink_format == "parquet"
    (p,) = load(sink_format="delta", sink_options={"writer": "spark"})
    assert p.sink_format == "delta"
    with pytest.raises(ValueError, match=r"sink_format.*'hudi'.*one of parquet, delta, iceberg"):
        load(sink_format="hudi")
    with pytest.raises(ValueError, match=r"writer 'arrow' writes Parquet files itself; sink_format 'delta'"):
        load(sink_format="delta", sink_options={"writer": "arrow"})


def test_an_iceberg_sink_names_its_catalog_without_a_password():
    uri = "sqlite:////data/iceberg.db"
    (p,) = load(sink_format="iceberg", sink_options={"iceberg_catalog_uri": uri})
    assert p.sink_options.job_options()["iceberg_catalog_uri"] == uri
    with pytest.raises(
        ValueError, match=r"sink_options.iceberg_catalog_uri = None.*SQLAlchemy URL.*'iceberg'"
    ):
        load(sink_format="iceberg")
    with pytest.raises(ValueError, match=r"iceberg_catalog_uri.*holds a password.*PGPASSWORD") as e:
        load(sink_format="iceberg", sink_options={"iceberg_catalog_uri": "postgresql://kbp:s3cret@db/lake"})
    assert "s3cret" not in str(e.value) and "postgresql://kbp:***@db/lake" in str(e.value)
    with pytest.raises(ValueError, match=r"iceberg_namespace = '1x'.*letters, digits"):
        load(sink_format="iceberg", sink_options={"iceberg_catalog_uri": uri, "iceberg_namespace": "1x"})


def test_reader_and_sink_options_are_typed_and_reach_the_job_as_one_flat_dict():
    (p,) = load(
        reader_options={"client": "kafka-python", "max_records_per_partition": 0},
        sink_options={"writer": "spark", "parquet_compression": "zstd", "parquet_plain_columns": ["value"]},
    )
    assert (p.reader_options.client, p.reader_options.max_records_per_partition) == ("kafka-python", 0)
    assert p.reader_options.arrow_batch_rows == 10_000  # the default
    assert p.sink_options.parquet_plain_columns == ("value",)
    assert {**p.reader_options.job_options(), **p.sink_options.job_options()} == {
        "client": "kafka-python",
        "max_records_per_partition": 0,
        "arrow_batch_rows": 10_000,
        "writer": "spark",
        "parquet_compression": "zstd",
        "parquet_plain_columns": ["value"],
    }
    # the pipeline's dict form (XCom, the UI) loads back to the same pipeline
    assert PipelineConfig.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_sink_keys_in_reader_options_move_to_sink_options_with_a_warning(caplog):
    with pytest.warns(
        DeprecationWarning, match=r"reader_options key\(s\) \['parquet_compression', 'writer'\] moved"
    ):
        (p,) = load(reader_options={"writer": "spark", "parquet_compression": "gzip", "client": "confluent"})
    assert (p.sink_options.writer, p.sink_options.parquet_compression) == ("spark", "gzip")
    assert p.reader_options.client == "confluent"
    assert "write them as sink_options" in caplog.text


def test_the_python_readers_arrow_batch_rows_keep_their_old_name_with_a_warning(caplog):
    """reader_options.max_records_per_batch shared its name with the settings key that caps a whole
    batch; it is arrow_batch_rows now, and a pipelines file with the old name still loads."""
    with pytest.warns(DeprecationWarning, match=r"'max_records_per_batch' is now 'arrow_batch_rows'"):
        (p,) = load(reader_options={"max_records_per_batch": 500, "client": "confluent"})
    assert (p.reader_options.arrow_batch_rows, p.reader_options.client) == (500, "confluent")
    assert p.reader_options.job_options()["arrow_batch_rows"] == 500
    assert "caps a whole batch" in caplog.text
    with pytest.raises(ValueError, match=r"both \['max_records_per_batch'\] and their new names"):
        load(reader_options={"max_records_per_batch": 500, "arrow_batch_rows": 600})


def test_a_planned_batch_waits_for_its_ingest_task_a_lease_two_intervals_and_a_minute_at_least():
    (p,) = load()
    assert p.planned_lease_s == 120.0  # the default batch lease
    (p,) = load(lease_s=20, batch_interval_s=15)
    assert p.planned_lease_s == 60.0  # a minute at least
    (p,) = load(lease_s=20, batch_interval_s=300)
    assert p.planned_lease_s == 600.0  # two intervals


def test_a_sink_that_cannot_hold_its_guarantees_is_refused_before_planning():
    """Issue 22, item 5 (and item 2's refusal): an object store cannot take the directory swap, and
    a local path under a multi-host Spark master would leave each executor's files on its own disk."""
    from airflow_kafka_backpressure.config.sink_placement import sink_refusal

    def cfg(sink: str, **kw) -> PipelineConfig:
        return PipelineConfig(name="orders", topics=("t",), sink=sink, **kw)

    for sink in ("s3a://lake/orders", "s3://lake/orders", "gs://b/o", "abfss://c@a.dfs.core.windows.net/o"):
        refusal = sink_refusal(cfg(sink), "local[2]")
        assert (
            refusal
            and "object store" in refusal
            and 'sink_format "delta"' in refusal
            and "Nothing was planned" in refusal
        )
        assert sink_refusal(cfg(sink, sink_format="delta"), "local[2]") is None  # one transaction per batch
    assert sink_refusal(cfg("hdfs://nn:8020/orders"), "yarn") is None
    remote = sink_refusal(cfg("/data/orders"), "spark://10.1.2.3:7077")
    assert remote and "other hosts" in remote and "sink_on_shared_filesystem" in remote
    assert sink_refusal(cfg("file:///data/orders"), "k8s://https://api:6443")
    assert sink_refusal(cfg("/data/orders", sink_on_shared_filesystem=True), "spark://10.1.2.3:7077") is None
    assert sink_refusal(cfg("/data/orders"), "local[2]") is None
    assert sink_refusal(cfg("/data/orders"), "spark://127.0.0.1:7077") is None  # executors on this host
    assert sink_refusal(cfg("/data/orders"), None) is None  # a Connect server's master is not known


def test_partition_by_is_a_day_or_hour_of_a_column_and_only_table_formats_take_it():
    (p,) = load(sink_format="delta", sink_options={"partition_by": "day(timestamp)"})
    assert p.sink_options.job_options()["partition_by"] == "day(timestamp)"
    for bad in ("week(timestamp)", "day(timestamp", "day()", "hour(a b)"):
        with pytest.raises(
            ValueError, match=r"sink_options.partition_by = .*day\(<column>\) or hour\(<column>\)"
        ):
            load(sink_format="delta", sink_options={"partition_by": bad})
    with pytest.raises(
        ValueError, match=r"partition_by = 'hour\(ts\)'.*'parquet' partitions nothing.*delta or iceberg"
    ):
        load(sink_options={"partition_by": "hour(ts)"})
