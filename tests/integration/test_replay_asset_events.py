"""Issue 39, item 5: a replay run that replays some batches while another fails used to fail its
replay task, and Airflow sends a task's Asset events only when it succeeds: the replayed batches,
already marked replayed, were never announced, and a downstream "one run per batch" DAG never ran
for them. Now the replay task succeeds and announces each batch it replayed, exactly once, and the
run's ``check`` task fails naming the batch that could not be replayed.

Under real Airflow (``dag.test()`` of the shipped replay DAG, SQLite metadata DB), the real broker,
real Spark (the connect engine) and a SQLite ledger; the scheduler's own step turns the events into
the shipped downstream example DAG's runs, and that run reads its batch back with pyarrow."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.operators.assets import sink_asset_name, triggering_batch
from kbp_local.producer import produce

from . import airflow_harness as af
from .kafka_samples import delete_records
from .test_replay_reliability import airflow_db, failed_by_hand, make_pipeline  # noqa: F401 (fixtures)
from .test_sink_asset_events import DOWNSTREAM_FILE, _events_by_asset


def test_batches_replayed_beside_a_failing_one_are_announced_once_each(make_pipeline, kafka_broker):
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models import DagModel, DagRun
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    p, ledger = make_pipeline(replay_interval_s=600, on_data_loss="fail")
    topic = p.topics[0]
    produce(kafka_broker.bootstrap, topic, count=8, partitions=4)  # 2 records per partition
    refused, replayed = failed_by_hand(p, ledger, [[(0, 0, 1)], [(0, 1, 2), (1, 0, 2), (2, 0, 2), (3, 0, 2)]])
    delete_records(kafka_broker.bootstrap, {TopicPartition(topic, 0): 1})  # the first batch's offset: gone
    downstream = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / DOWNSTREAM_FILE.name
    shutil.copy(DOWNSTREAM_FILE, downstream)
    try:
        r = af.run_dag(p.replay_dag_id, 0)
        assert (
            ledger.batch(refused).status == "failed" and "cannot be replayed" in ledger.batch(refused).error
        )
        assert ledger.batch(replayed).status == "replayed"

        with create_session() as session:
            asset = session.query(AssetModel).filter_by(name=sink_asset_name(p.name)).one()
            events = session.query(AssetEvent).filter_by(asset_id=asset.id).all()
            # exactly one event, for the replayed batch (before: none, the replay task failed)
            assert [e.partition_key for e in events] == [str(replayed)]
            announced = events[0].extra["batches"][str(replayed)]
            assert (announced["batch_id"], announced["records"], announced["replay"]) == (replayed, 7, True)
            assert str(refused) not in events[0].extra["batches"]
        # ... and the run still fails, naming the batch that could not be replayed
        assert r.state == "failed", r.task_states
        assert (r.task_states["replay"], r.task_states["check"]) == ("success", "failed")
        assert [x["batch_id"] for x in r.xcoms["replay"]] == [replayed]

        with create_session() as session:  # the scheduler's step: one downstream run for the batch
            dag_id = f"kbp_downstream_{p.name}"
            session.query(DagModel).filter_by(dag_id=dag_id).update({"is_paused": False})
            session.commit()
            SchedulerJobRunner(job=Job())._create_dagruns_for_partitioned_asset_dags(session)
            session.commit()
            (run,) = session.query(DagRun).filter_by(dag_id=dag_id).all()
            assert run.partition_key == str(replayed)
            batch = triggering_batch({"dag_run": run, "triggering_asset_events": _events_by_asset(run)}, p)
            import pyarrow.dataset as ds

            assert batch["batch_id"] == replayed
            assert ds.dataset(batch["output_path"], format="parquet").count_rows() == 7
    finally:
        downstream.unlink()
