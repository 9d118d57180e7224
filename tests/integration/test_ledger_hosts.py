"""Issue 9, item 3: a SQLite ledger is refused when Airflow's configured executor(s) run tasks on
several hosts, or a triggerer runs on another host — read from the real Airflow configuration
(environment variables), through a real connection; the DAG's plan task fails under dag.test."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.hooks.ledger import LedgerHook

from . import airflow_harness as af


def _sqlite_connection(monkeypatch, tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_HOSTS_LEDGER",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url}}),
    )
    return url


@pytest.mark.parametrize(
    "executor",
    [
        "CeleryExecutor",
        "LocalExecutor,KubernetesExecutor",
        "LocalExecutor,edge:airflow.providers.edge3.executors.EdgeExecutor",
    ],
)
def test_sqlite_ledger_is_refused_under_a_multi_host_executor(monkeypatch, tmp_path, executor):
    _sqlite_connection(monkeypatch, tmp_path)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    with pytest.raises(ValueError) as e:
        LedgerHook("kbp_hosts_ledger").get_conn()
    msg = str(e.value)
    assert "connection 'kbp_hosts_ledger' is a SQLite file" in msg and "ledger_conn_id" in msg
    assert executor.split(",")[-1] in msg
    assert not (tmp_path / "ledger.db").exists()  # nothing was created on this host


def test_sqlite_ledger_is_refused_with_a_remote_triggerer_and_allowed_on_one_host(monkeypatch, tmp_path):
    _sqlite_connection(monkeypatch, tmp_path)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert LedgerHook("kbp_hosts_ledger").get_conn().pipelines() == []  # one host: fine
    monkeypatch.setenv("AIRFLOW__KAFKA_BACKPRESSURE__REMOTE_TRIGGERER", "True")
    with pytest.raises(ValueError, match=r"a triggerer runs on another host .*ledger_conn_id"):
        LedgerHook("kbp_hosts_ledger").get_conn()
    with pytest.raises(ValueError, match=r"the default ledger \(no ledger_conn_id\) is a SQLite file"):
        LedgerHook(None).get_conn()


def test_a_postgres_ledger_is_accepted_under_celery(monkeypatch, postgres_url):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_HOSTS_PG",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": postgres_url}}),
    )
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    assert isinstance(LedgerHook("kbp_hosts_pg").get_conn().pipelines(), list)


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def test_the_plan_task_fails_with_a_remote_triggerer_and_a_sqlite_ledger(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)
    p, _ = make()
    monkeypatch.setenv("AIRFLOW__KAFKA_BACKPRESSURE__REMOTE_TRIGGERER", "True")
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.task_states["plan"] == "failed"
    assert not (tmp_path / "ledger.db").exists()
