"""The ``maintenance`` of a pipeline (declared in ``batch/options.py``): validated when the
pipelines file loads (a table format only; the retention rule), its DAG and its task's timeout, and
the ledger lock a maintained table's batches and its maintenance share."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_kafka_backpressure.batch.options import MaintenanceOptions
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.dag_factory import build_dags, task_timeouts
from airflow_kafka_backpressure.operators.common import sink_lock_wait_s, table_lock_name
from airflow_kafka_backpressure.sinks import commit_lock_name
from airflow_kafka_backpressure.sinks.maintenance import retention_hours_whole

BASE = {
    "name": "p",
    "topics": ["t"],
    "sink": "/data/t",
    "sink_format": "iceberg",
    "sink_options": {"iceberg_catalog_uri": "sqlite:////data/catalog.db"},
}


def test_the_pipelines_file_refuses_a_retention_shorter_than_a_batch_in_flight():
    slow = {**BASE, "batch_timeout_s": 7200}
    with pytest.raises(
        ValueError, match=r"maintenance\.retention_hours = 1 .*longest a batch can be in flight"
    ):
        PipelineConfig.from_dict({**slow, "maintenance": {"retention_hours": 1}})
    ok = PipelineConfig.from_dict({**slow, "maintenance": {"retention_hours": 3}})
    assert ok.maintenance == MaintenanceOptions(retention_hours=3)
    assert ok.maintenance.retention_s >= ok.longest_batch_in_flight_s > 7200


@pytest.mark.parametrize(
    "maintenance, problem",
    [
        ({"retention_hours": 0.5}, "retention_hours = 0.5 is invalid: a finite number >= 1"),
        ({"target_file_mb": 0}, "target_file_mb = 0 is invalid: must be >= 1"),
        ({"sort_by": "a b"}, "sort_by = 'a b' is invalid: a column name"),
        ({"sort": "x"}, "unknown key(s) ['sort']"),
        (5, "maintenance must be a JSON object"),
    ],
)
def test_a_wrong_maintenance_names_the_key(maintenance, problem):
    with pytest.raises(ValueError) as e:
        PipelineConfig.from_dict({**BASE, "maintenance": maintenance})
    assert problem in str(e.value) and "pipeline 'p'" in str(e.value)


def test_the_parquet_directory_has_no_table_to_maintain():
    with pytest.raises(ValueError, match="sink_format 'parquet' has no table to maintain.*delta, iceberg"):
        PipelineConfig.from_dict({**BASE, "sink_options": {}, "sink_format": "parquet", "maintenance": {}})


def test_a_maintained_pipeline_has_a_maintenance_dag_and_round_trips():
    p = PipelineConfig.from_dict({**BASE, "maintenance": {"schedule": "0 3 * * *", "sort_by": "user_id"}})
    assert PipelineConfig.from_dict(p.to_dict()) == p
    dags = build_dags([p, PipelineConfig.from_dict({**BASE, "name": "q"})])
    assert sorted(dags) == ["kbp_ingest_p", "kbp_ingest_q", "kbp_maintain_p", "kbp_replay_p", "kbp_replay_q"]
    (task,) = dags["kbp_maintain_p"].tasks
    assert task.execution_timeout == timedelta(seconds=p.batch_task_timeout + 3600)
    assert task_timeouts(p)["maintain"] == task.execution_timeout


def test_a_maintained_tables_batches_and_its_maintenance_share_one_lock():
    maintained = PipelineConfig.from_dict(
        {**BASE, "sink_options": {}, "sink_format": "delta", "maintenance": {"timeout_minutes": 120}}
    )
    plain = PipelineConfig.from_dict({**BASE, "sink_options": {}, "sink_format": "delta"})
    assert table_lock_name(plain) is None and sink_lock_wait_s(plain) == 0
    assert table_lock_name(maintained) == "sink-commit:file:///data/t"
    assert sink_lock_wait_s(maintained) == max(maintained.batch_task_timeout, 7200)
    assert commit_lock_name("parquet", "/data/t", {}, maintained=True) is None  # nothing to maintain


def test_retention_in_whole_hours_is_never_shorter():
    assert [retention_hours_whole(s) for s in (0, 1, 3600, 3601, 7200)] == [0, 1, 1, 2, 2]
