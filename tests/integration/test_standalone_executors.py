"""Executor scaling on a real Spark standalone cluster (master + one worker on 127.0.0.1).

The shipped ingest DAG under real Airflow (``dag.test()``), the real broker, the Spark provider's
SparkSubmitHook against ``spark://127.0.0.1:PORT`` and a SQLite ledger. The executor count the job
reports (ingest XCom) is checked independently against the cluster: the master's ``completedapps``
entry for the application (cores granted; one core per executor here) and the worker's
``finishedexecutors`` for that application id (one entry per executor process it ran).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.settings import parse_settings
from airflow_kafka_backpressure.control.scaling import executor_target
from kbp_local.producer import produce

from . import airflow_harness as af
from .test_pipeline_e2e import sink_ids

EXECUTOR_CORES = 1


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def make_pipeline(kafka_broker, spark_standalone, topic_name, tmp_path, monkeypatch, airflow_db):
    return af.pipeline_maker(
        monkeypatch,
        kafka_broker.bootstrap,
        topic_name,
        tmp_path,
        spark_master=spark_standalone.master_url,
        executor_cores=EXECUTOR_CORES,
        executor_memory="512m",
        driver_memory="512m",
    )


def cluster_executors(cluster, p: PipelineConfig, batch_id: int) -> tuple[int, int]:
    """(executors by the master's cores granted, executors the worker ran) for the batch's app."""
    app = cluster.completed_app(f"kbp-{p.name}-batch-{batch_id}")
    assert app["state"] == "FINISHED", app
    assert app["memoryperexecutor"] == 512
    by_cores = app["cores"] // EXECUTOR_CORES
    ran = cluster.finished_executors(app["id"], expected=by_cores)
    return by_cores, len(ran)


def test_the_executor_target_reaches_the_job_on_a_standalone_cluster(
    make_pipeline, kafka_broker, spark_standalone
):
    p, ledger = make_pipeline()
    af.set_variable(p.executors_variable, json.dumps({"executors": 3}))
    produce(kafka_broker.bootstrap, p.topics[0], count=200, partitions=4)

    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.state == "success", r.task_states
    assert r.xcoms["ingest"]["records"] == 200
    assert r.xcoms["ingest"]["executors"] == 3  # what the job's driver saw
    assert cluster_executors(spark_standalone, p, 1) == (3, 3)  # what the cluster ran
    assert ledger.batch(1).executors == 3  # the ledger stores the count the job measured
    assert sink_ids(p.sink) == Counter(range(200))


def test_the_scale_task_scales_up_then_down_and_the_next_job_gets_the_count(
    make_pipeline, kafka_broker, spark_standalone
):
    # spark-submit alone takes longer than a 5 s interval: processing / interval >= 0.9
    p, ledger = make_pipeline(batch_interval_s=5)
    settings = {"mode": "spark", "cooldown_batches": 0, "max_executors": 4, "initial_executors": 1}
    af.set_variable(p.settings_variable, json.dumps(settings))
    policy = parse_settings(settings).scaling_policy()
    topic = p.topics[0]

    produce(kafka_broker.bootstrap, topic, count=120, partitions=4)
    r1 = af.run_dag(p.ingest_dag_id, 0, 5)
    assert r1.state == "success", r1.task_states
    assert r1.xcoms["ingest"]["executors"] == 1
    assert cluster_executors(spark_standalone, p, 1) == (1, 1)
    b1 = ledger.batch(1)
    assert b1.executors == 1
    up = executor_target(1, [b1.processing_ms], p.batch_interval_ms, policy)
    assert up.action == "up" and up.target > 1
    assert {k: r1.xcoms["scale"][k] for k in ("target", "action", "ratio", "reason")} == up.to_dict()
    assert r1.xcoms["scale"]["window_batch_ids"] == [1]
    assert af.variable(p.executors_variable)["executors"] == up.target

    # the next job runs with the raised count; this time the interval is an hour (a config change
    # the DAG picks up), so the job is now fast against it and the scale task removes one executor
    p, _ = make_pipeline(batch_interval_s=3600)
    produce(kafka_broker.bootstrap, topic, count=80, partitions=4, start_id=120)
    r2 = af.run_dag(p.ingest_dag_id, 1, 3600)
    assert r2.state == "success", r2.task_states
    assert r2.xcoms["ingest"]["executors"] == up.target
    assert cluster_executors(spark_standalone, p, 2) == (up.target, up.target)
    b2 = ledger.batch(2)
    assert b2.executors == up.target
    # the window holds only batches since the last change (batch 1 was before it)
    down = executor_target(up.target, [b2.processing_ms], p.batch_interval_ms, policy, batches_since_change=1)
    assert down.action == "down" and down.target == up.target - 1
    assert {k: r2.xcoms["scale"][k] for k in ("target", "action", "ratio", "reason")} == down.to_dict()
    assert r2.xcoms["scale"]["window_batch_ids"] == [2]
    assert af.variable(p.executors_variable)["executors"] == up.target - 1

    assert sink_ids(p.sink) == Counter(range(200))
