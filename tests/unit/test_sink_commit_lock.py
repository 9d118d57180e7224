"""Which sinks need the ledger's lock of their table around each batch's job (the sink format's
answer, :meth:`SinkFormat.commit_lock_reason`), under which name, and the task timeouts that leave
room for waiting for it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.dag_factory import REPLAY_BATCHES_PER_RUN, task_timeouts
from airflow_kafka_backpressure.operators.common import sink_lock_wait_s
from airflow_kafka_backpressure.sinks import DeltaSink, commit_lock_name, normalized_sink_uri
from airflow_kafka_backpressure.sinks.delta import log_store_class

DYNAMO = "io.delta.storage.S3DynamoDBLogStore"


@pytest.mark.parametrize(
    "sink, conf, store",
    [
        ("s3a://b/t", {}, "io.delta.storage.S3SingleDriverLogStore"),
        ("S3://b/t", {}, "io.delta.storage.S3SingleDriverLogStore"),
        ("s3n://b/t", {}, "io.delta.storage.S3SingleDriverLogStore"),
        ("/data/t", {}, "io.delta.storage.HDFSLogStore"),
        ("file:/data/t", {}, "io.delta.storage.HDFSLogStore"),
        ("hdfs://nn/t", {}, "io.delta.storage.HDFSLogStore"),
        ("abfss://c@a.dfs.core.windows.net/t", {}, "io.delta.storage.AzureLogStore"),
        ("gs://b/t", {}, "io.delta.storage.GCSLogStore"),
        ("s3a://b/t", {"spark.delta.logStore.s3a.impl": DYNAMO}, DYNAMO),
        ("s3a://b/t", {"delta.logStore.s3a.impl": DYNAMO}, DYNAMO),
        ("s3a://b/t", {"spark.delta.logStore.s3.impl": DYNAMO}, "io.delta.storage.S3SingleDriverLogStore"),
        ("s3a://b/t", {"spark.delta.logStore.class": DYNAMO}, DYNAMO),
    ],
)
def test_the_log_store_delta_commits_a_table_with(sink, conf, store):
    assert log_store_class(sink, conf) == store


def test_delta_needs_the_lock_only_where_its_log_store_is_safe_within_one_driver():
    reason = DeltaSink().commit_lock_reason("s3a://b/t", {})
    assert reason is not None and "S3SingleDriverLogStore" in reason and "two drivers" in reason
    assert DeltaSink().commit_lock_reason("s3a://b/t", {"spark.delta.logStore.s3a.impl": DYNAMO}) is None
    assert DeltaSink().commit_lock_reason("/data/t", {}) is None
    assert DeltaSink().commit_lock_reason("hdfs://nn/t", {}) is None


@pytest.mark.parametrize(
    "sink, uri",
    [
        ("s3a://Bucket/tables/orders/", "s3://bucket/tables/orders"),
        ("s3://bucket//tables/./orders", "s3://bucket/tables/orders"),
        ("s3n://bucket/tables/x/../orders", "s3://bucket/tables/orders"),
        ("hdfs://nn:8020/t/", "hdfs://nn:8020/t"),
        ("/data//orders/", "file:///data/orders"),
        ("file:///data/orders", "file:///data/orders"),
    ],
)
def test_one_table_one_lock_name_however_its_path_is_spelled(sink, uri):
    assert normalized_sink_uri(sink) == uri


def test_the_lock_name_is_the_table_not_the_pipeline():
    assert commit_lock_name("delta", "s3a://b/t/", {}) == commit_lock_name("delta", "s3://b/t", {})
    assert commit_lock_name("delta", "s3a://b/t", {}) == "sink-commit:s3://b/t"
    assert commit_lock_name("delta", "/data/t", {}) is None
    assert commit_lock_name("parquet", "s3a://b/t", {}) is None  # the Parquet directory: its own swap
    assert commit_lock_name("delta", "s3a://b/t", {"spark.delta.logStore.class": DYNAMO}) is None


def pipeline(**kw) -> PipelineConfig:
    return PipelineConfig(name="orders", topics=("orders",), sink_format="delta", **kw)


def test_a_batch_into_a_locked_table_waits_up_to_a_batch_task_timeout_and_its_task_allows_for_it():
    locked, free = pipeline(sink="s3a://b/orders"), pipeline(sink="/data/orders")
    assert sink_lock_wait_s(free) == 0
    assert sink_lock_wait_s(locked) == locked.batch_task_timeout
    t_locked, t_free = task_timeouts(locked), task_timeouts(free)
    wait = timedelta(seconds=locked.batch_task_timeout)
    assert t_locked["ingest"] == t_free["ingest"] + wait
    assert t_locked["replay"] == t_free["replay"] + REPLAY_BATCHES_PER_RUN * wait
    assert t_locked["plan"] == t_free["plan"]
