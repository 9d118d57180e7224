"""The record and scale tasks update their state Variables (controller state, executor target) by
read-modify-write under the pipeline's ledger lock, so concurrent runs (a cleared run beside the
scheduled one, a manual run) apply their updates one after the other and none is lost. Real Airflow
(``dag.test()``, SQLite metadata DB), the real broker and a SQLite ledger: while the test holds the
lock the tasks fail after the ledger's bound, naming the lock, and write nothing; once it is free
they run, and two records' updates are both kept."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.operators.common import state_lock
from kbp_local.producer import ensure_topic

from . import airflow_harness as af

DAG_ID = "kbp_test_state_lock"
SPEC_ENV = "KBP_TEST_STATE_LOCK"
DAG_FILE = af.spec_dag_source(
    DAG_ID,
    SPEC_ENV,
    "from airflow_kafka_backpressure.operators import ExecutorScalingOperator, RecordBatchMetricsOperator",
    """
record = RecordBatchMetricsOperator(task_id="record", pipeline=spec["pipeline"], metrics=spec["metrics"])
scale = ExecutorScalingOperator(task_id="scale", pipeline=spec["pipeline"])
record >> scale
""",
)


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def state_dag(kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db):
    dag_file = af.install_dag_file("kbp_test_state_lock.py", DAG_FILE)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    connections = {
        "kbp_lock_kafka": {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_broker.bootstrap}},
        # a short ledger bound, so a held lock fails the task quickly
        "kbp_lock_ledger": {"conn_type": "generic", "extra": {"sqlalchemy_url": url, "timeout_s": 3}},
    }
    for conn_id, conn in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    pipeline = {
        "name": "locktest",
        "topics": [topic_name],
        "sink": str(tmp_path / "sink"),
        "kafka_conn_id": "kbp_lock_kafka",
        "ledger_conn_id": "kbp_lock_ledger",
    }
    ledger = Ledger(url)
    ledger.create_all()

    def run(n: int, batch_id: int):
        metrics = {
            "batch_id": batch_id,
            "records": 10 * batch_id,
            "bytes": 100,
            "launched_at_ms": 1_000,
            "read_started_at_ms": 2_000,
            "committed_at_ms": 4_000 + batch_id,
            "executors": 1,
        }
        monkeypatch.setenv(SPEC_ENV, json.dumps({"pipeline": pipeline, "metrics": metrics}))
        return af.run_dag(DAG_ID, n)

    def finished_batch(i: int) -> int:
        b = ledger.record_plan(
            "locktest", f"run{i}", [OffsetRange(topic_name, 0, i, i + 1)], pipeline["sink"], 1000, 0
        ).batch_id
        ledger.mark_running(b)
        ledger.mark_succeeded(b, 1, 1)
        return b

    yield run, finished_batch, ledger
    dag_file.unlink()


def test_record_and_scale_update_their_variables_under_the_ledger_lock(state_dag, capfd):
    from airflow_kafka_backpressure.config.pipeline import PipelineConfig

    run, finished_batch, ledger = state_dag
    p = PipelineConfig(name="locktest", topics=("x",), sink="/x")
    first = finished_batch(0)

    capfd.readouterr()
    with state_lock(p, ledger, p.controller_variable):
        held = run(0, first)
    assert held.task_states["record"] == "failed", held.task_states
    out, err = capfd.readouterr()  # the task log
    assert "Ledger lock 'locktest:variable:kbp.locktest.controller_state'" in out + err
    assert af.variable(p.controller_variable) is None  # nothing written while another holds the lock

    with state_lock(p, ledger, p.executors_variable):
        scale_held = run(1, first)
    assert scale_held.task_states == {"record": "success", "scale": "failed"}, scale_held.task_states
    out, err = capfd.readouterr()
    assert "Ledger lock 'locktest:variable:kbp.locktest.executor_target'" in out + err
    assert af.variable(p.executors_variable) is None

    second = finished_batch(1)
    assert run(2, second).state == "success"
    observations = [o[0] for o in af.variable(p.controller_variable)["cost"]["observations"]]
    assert observations == [first, second]  # both records' updates kept
    assert af.variable(p.executors_variable)["executors"] >= 1
