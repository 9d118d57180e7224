"""Sink Asset events under real Airflow (``dag.test()``, SQLite metadata DB): a task that commits
SEVERAL batches (as the replay operator does) emits one event per batch through the task SDK; Airflow
queues one partitioned run of the shipped downstream DAG per event; the scheduler's own code creates
those runs, and each run reads exactly the batch it was told about."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import batch_path
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.operators.assets import sink_asset, sink_asset_name, sink_uri

from . import airflow_harness as af

REPO = Path(__file__).resolve().parents[2]
DOWNSTREAM_FILE = REPO / "dags" / "kafka_backpressure_downstream_example.py"
PRODUCER_ID = "kbp_test_sink_events"
PRODUCER_FILE = f'''
import json, os
from datetime import datetime
from airflow.sdk import DAG, BaseOperator
from airflow_kafka_backpressure.operators.assets import batch_event_extra, emit_batch_events, sink_asset
from airflow_kafka_backpressure.batch.models import OffsetRange, batch_path
from airflow_kafka_backpressure.config.pipeline import load_pipelines


class CommitBatches(BaseOperator):
    """Writes the batches of the spec into the sink and emits one event per batch, like replay."""

    def __init__(self, pipeline, batches, **kw):
        super().__init__(outlets=[sink_asset(pipeline)], **kw)
        self.pipeline, self.batches = pipeline, batches

    def execute(self, context):
        import pyarrow as pa, pyarrow.parquet as pq
        out = []
        for b in self.batches:
            path = batch_path(self.pipeline.sink, b["batch_id"])
            os.makedirs(path, exist_ok=True)
            pq.write_table(pa.table({{"id": list(range(b["records"]))}}), os.path.join(path, "part-0.parquet"))
            ranges = [OffsetRange(**r) for r in b["ranges"]]
            out.append(batch_event_extra(b["batch_id"], ranges, b["records"], replay=b["replay"], output_path=path))
        return emit_batch_events(context, self.pipeline, out)


spec = os.environ.get("KBP_TEST_SINK_EVENTS")
if spec:
    (pipeline,) = load_pipelines()
    with DAG("{PRODUCER_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        CommitBatches(task_id="commit", pipeline=pipeline, batches=json.loads(spec))
'''

BATCHES = [
    {
        "batch_id": 7,
        "records": 5,
        "replay": True,
        "ranges": [{"topic": "t", "partition": 0, "from_offset": 10, "until_offset": 15}],
    },
    {
        "batch_id": 8,
        "records": 3,
        "replay": True,
        "ranges": [{"topic": "t", "partition": 1, "from_offset": 4, "until_offset": 7}],
    },
    {
        "batch_id": 9,
        "records": 2,
        "replay": False,
        "ranges": [
            {"topic": "t", "partition": 0, "from_offset": 15, "until_offset": 17},
            {"topic": "t", "partition": 1, "from_offset": 7, "until_offset": 7},
        ],
    },
]


def test_sink_uri_follows_airflows_asset_uri_rules(tmp_path):
    assert sink_uri(str(tmp_path / "sink")) == (tmp_path / "sink").resolve().as_uri()
    assert sink_uri("s3a://lake/raw/orders") == "s3://lake/raw/orders"
    assert sink_uri("gs://b/p") == "gs://b/p" and sink_uri("hdfs://nn:8020/x") == "hdfs://nn:8020/x"
    asset = sink_asset(PipelineConfig(name="orders", topics=("t",), sink="s3a://lake/raw/orders"))
    assert (asset.name, asset.uri) == ("kbp.orders.sink", "s3://lake/raw/orders")


@pytest.fixture
def dags(tmp_path, monkeypatch):
    af.reset_airflow_db()
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    folder.mkdir(parents=True, exist_ok=True)
    p = PipelineConfig(name="assets_demo", topics=("t",), sink=str(tmp_path / "sink"))
    pipelines = tmp_path / "pipelines.json"
    pipelines.write_text(json.dumps({"pipelines": [p.to_dict()]}))
    monkeypatch.setenv("KBP_PIPELINES_FILE", str(pipelines))
    monkeypatch.setenv("KBP_TEST_SINK_EVENTS", json.dumps(BATCHES))
    shutil.copy(DOWNSTREAM_FILE, folder / DOWNSTREAM_FILE.name)
    (folder / "kbp_test_sink_events.py").write_text(PRODUCER_FILE)
    yield p
    (folder / "kbp_test_sink_events.py").unlink()
    (folder / DOWNSTREAM_FILE.name).unlink()


def test_one_event_per_committed_batch_and_one_downstream_run_each_reading_its_batch(dags):
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models import DagModel, DagRun
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    p = dags
    produced = af.run_dag(PRODUCER_ID, 1)
    assert produced.task_states == {"commit": "success"}, produced
    assert produced.xcoms["commit"] == ["7", "8", "9"]

    with create_session() as session:
        asset = session.query(AssetModel).filter_by(name=sink_asset_name(p.name)).one()
        assert asset.uri == sink_uri(p.sink)
        events = session.query(AssetEvent).filter_by(asset_id=asset.id).order_by(AssetEvent.id).all()
        assert sorted(e.partition_key for e in events) == ["7", "8", "9"]  # one event per batch
        for e in events:
            expected = BATCHES[int(e.partition_key) - 7]
            got = e.extra["batches"][e.partition_key]
            assert got["records"] == expected["records"] and got["replay"] == expected["replay"]
            assert got["ranges"] == [r for r in expected["ranges"] if r["until_offset"] > r["from_offset"]]
            assert got["output_path"] == batch_path(p.sink, expected["batch_id"])

        # The scheduler's own step that turns partitioned Asset events into DAG runs.
        session.query(DagModel).filter_by(dag_id=f"kbp_downstream_{p.name}").update({"is_paused": False})
        session.commit()
        SchedulerJobRunner(job=Job())._create_dagruns_for_partitioned_asset_dags(session)
        session.commit()
        runs = session.query(DagRun).filter_by(dag_id=f"kbp_downstream_{p.name}").order_by(DagRun.id).all()
        assert sorted(r.partition_key for r in runs) == ["7", "8", "9"]  # one run per batch
        run_ids = {r.partition_key: r.run_id for r in runs}

    # Each run reads exactly its batch.
    from airflow_kafka_backpressure.operators.assets import triggering_batch

    with create_session() as session:
        for key, run_id in run_ids.items():
            dr = session.query(DagRun).filter_by(run_id=run_id).one()
            context = {"dag_run": dr, "triggering_asset_events": _events_by_asset(dr)}
            batch = triggering_batch(context, p)
            assert batch["batch_id"] == int(key)
            import pyarrow.dataset as ds

            assert (
                ds.dataset(batch["output_path"], format="parquet").count_rows()
                == BATCHES[int(key) - 7]["records"]
            )


def _events_by_asset(dr):
    out = {}
    for event in dr.consumed_asset_events:
        out.setdefault(event.asset, []).append(event)
    return out
