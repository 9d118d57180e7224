"""Example downstream DAG: one run per committed batch of each pipeline, reading exactly that batch.

For every pipeline of the pipelines file (``$KBP_PIPELINES_FILE``, else ``pipelines.json`` beside
this file) it builds ``kbp_downstream_<pipeline>``, scheduled on the pipeline's sink Asset with a
``PartitionedAssetTimetable``: the ingest and replay tasks emit one event per committed batch with
the batch id as partition key, and Airflow creates one run per key. The task reads exactly that
batch without Spark (``batch_dataset``: the batch's Parquet directory, or its rows of the Delta
table version or the Iceberg snapshot its commit created, read with ``deltalake`` or pyiceberg)
and reports it with the event's ranges. Copy
this file into your DAGs folder and replace ``read_batch`` with your own processing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG, PartitionedAssetTimetable, task

from airflow_kafka_backpressure.config.pipeline import PIPELINES_FILE_ENV, load_pipelines
from airflow_kafka_backpressure.operators.assets import batch_dataset, sink_asset, triggering_batch


def build_downstream_dag(pipeline) -> DAG:
    with DAG(
        dag_id=f"kbp_downstream_{pipeline.name}",
        schedule=PartitionedAssetTimetable(assets=sink_asset(pipeline)),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        tags=["kafka-backpressure", "downstream", pipeline.name],
        doc_md=f"Runs once per committed batch of pipeline `{pipeline.name}` (replays included).",
    ) as dag:

        @task
        def read_batch(**context) -> dict:
            batch = triggering_batch(context, pipeline)
            rows = batch_dataset(batch, pipeline.name).count_rows()
            print(f"batch {batch['batch_id']} (replay={batch['replay']}): {rows} rows from {batch['ranges']}")
            return {
                "batch_id": batch["batch_id"],
                "rows": rows,
                "records": batch["records"],
                "replay": batch["replay"],
                "ranges": batch["ranges"],
            }

        read_batch()
    return dag


_file = os.environ.get(PIPELINES_FILE_ENV) or str(Path(__file__).with_name("pipelines.json"))
if Path(_file).exists():
    for _p in load_pipelines(_file):
        globals()[f"kbp_downstream_{_p.name}"] = build_downstream_dag(_p)
