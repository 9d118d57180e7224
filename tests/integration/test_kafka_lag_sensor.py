"""KafkaLagSensor under real Airflow (``dag.test()``, SQLite metadata DB) against the real embedded
broker: a lag builds up because records are produced and nothing ingests them. Poke mode and
deferred (``dag.test()`` runs the trigger inline); the retention-risk case uses the offsets the
broker reports (nothing deletes records of this test's topic, so its earliest offset stays 0 and a
position within the margin of 0 is at risk)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook
from kbp_local.producer import ensure_topic, produce

from . import airflow_harness as af

DAG_ID = "kbp_test_lag_sensor"
SPEC_ENV = "KBP_TEST_LAG_SENSOR"
DAG_FILE = f'''
import json, os
from datetime import datetime
from airflow.sdk import DAG
from airflow_kafka_backpressure.sensors.kafka_lag import KafkaLagSensor

spec = os.environ.get("{SPEC_ENV}")
if spec:
    spec = json.loads(spec)
    with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaLagSensor(task_id="lag", **spec)
'''


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def lag_dag(kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db):
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kbp_test_lag_sensor.py").write_text(DAG_FILE)
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_LAG_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_broker.bootstrap}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_LAG_LEDGER",
        json.dumps(
            {"conn_type": "generic", "extra": {"sqlalchemy_url": f"sqlite:///{tmp_path / 'ledger.db'}"}}
        ),
    )
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    pipeline = {
        "name": "lagtest",
        "topics": [topic_name],
        "sink": str(tmp_path / "sink"),
        "kafka_conn_id": "kbp_lag_kafka",
        "ledger_conn_id": "kbp_lag_ledger",
        "group_id": f"{topic_name}-g",
    }

    def run(n: int, **sensor):
        monkeypatch.setenv(
            SPEC_ENV, json.dumps({"pipeline": pipeline, "poke_interval": 0.2, "timeout": 60, **sensor})
        )
        return af.run_dag(DAG_ID, n)

    yield run, kafka_broker.bootstrap, topic_name, pipeline["group_id"]
    (folder / "kbp_test_lag_sensor.py").unlink()


def _produce_once_started(bootstrap: str, topic: str, count: int, start_id: int, n: int) -> threading.Thread:
    """Produce once the sensor of run number ``n`` has started (and so checked, or is about to).

    Keyed on the task instance's start date, not on its state: in deferred mode under
    ``dag.test()`` the task is ``running`` only for the ~50 ms of its first check (then deferred,
    then queued while the trigger runs inline), which a poll can miss."""

    def wait_then_produce() -> None:
        import time

        from airflow.models import DagRun, TaskInstance
        from airflow.utils.session import create_session

        when = af.logical_date(n)
        for _ in range(600):
            with create_session() as session:
                ti = (
                    session.query(TaskInstance)
                    .join(
                        DagRun,
                        (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id),
                    )
                    .filter(
                        TaskInstance.dag_id == DAG_ID,
                        TaskInstance.task_id == "lag",
                        DagRun.logical_date == when,
                    )
                    .first()
                )
                if ti is not None and ti.start_date is not None:
                    break
            time.sleep(0.1)
        time.sleep(1.0)  # a few checks (0.2 s apart) see the small lag first
        produce(bootstrap, topic, count=count, partitions=2, start_id=start_id)

    t = threading.Thread(target=wait_then_produce, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferred"])
def test_the_sensor_fires_when_a_real_lag_crosses_the_threshold(lag_dag, deferrable):
    run, bootstrap, topic, _group = lag_dag
    produce(bootstrap, topic, count=10, partitions=2)  # lag 10: below the threshold
    # then 30, above: produced only once the sensor runs and has checked (deferred: the trigger polls)
    n = 2 if deferrable else 1
    later = _produce_once_started(bootstrap, topic, count=20, start_id=10, n=n)
    try:
        result = run(n, max_lag_records=25, deferrable=deferrable)
    finally:
        later.join()
    assert result.task_states == {"lag": "success"}, result
    xcom = result.xcoms["lag"]
    assert xcom["report"]["total_lag"] == 30
    assert [p["lag"] for p in xcom["report"]["partitions"]] == [15, 15]
    (reason,) = xcom["reasons"]
    assert "30 records" in reason and "max_lag_records=25" in reason


def test_deferred_sensor_fires_on_seconds_behind_by_the_records_kafka_timestamps(lag_dag):
    run, bootstrap, topic, _group = lag_dag
    produce(bootstrap, topic, count=4, partitions=2)
    result = run(3, max_seconds_behind=0.5, deferrable=True)
    assert result.task_states == {"lag": "success"}, result
    report = result.xcoms["lag"]["report"]
    assert all(p["seconds_behind"] > 0.5 for p in report["partitions"])
    assert all(p["oldest_unwritten_ts_ms"] is not None for p in report["partitions"])


def test_retention_risk_from_the_offsets_the_broker_reports(lag_dag):
    run, bootstrap, topic, group = lag_dag
    produce(bootstrap, topic, count=30, partitions=2)  # 15 per partition, earliest stays 0
    with KafkaOffsetsHook("kbp_lag_kafka").get_conn() as kafka:
        tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        assert kafka.earliest_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        kafka.commit_offsets(group, {tp0: 3, tp1: 15})  # partition 0: 3 records above earliest, 12 unread
    # margin 2: partition 0 is 3 records from the earliest offset, not at risk: the sensor times out
    calm = run(4, retention_margin_records=2, timeout=1, soft_fail=True, deferrable=True)
    assert calm.task_states == {"lag": "skipped"}, calm
    # margin 3: at risk; partition 1 has nothing unread, so it never is
    risky = run(5, retention_margin_records=3)
    assert risky.task_states == {"lag": "success"}, risky
    (reason,) = risky.xcoms["lag"]["reasons"]
    assert reason.startswith(f"{topic}-0: position 3 is 3 records from the earliest retained offset 0")
    assert risky.xcoms["lag"]["report"]["at_risk"] == [f"{topic}-0"]


def test_an_unreachable_broker_fails_the_deferred_sensor_with_the_connection_named(lag_dag, monkeypatch):
    from kbp_local.process import free_port

    run, *_ = lag_dag
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_LAG_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{free_port()}"}}),
    )
    result = run(6, max_lag_records=0, broker_timeout_s=1)
    assert result.task_states == {"lag": "failed"}, result
