"""One factory for a pipeline's DAGs: ingest (plan → ingest → record → scale), replay, and, for a
table sink with a ``maintenance``, the table's maintenance.

The ingest DAG runs once per batch interval, one run at a time (``max_active_runs=1``), so each
run's plan starts where the previous one ended. The replay DAG waits for failed batches and replays
them, those due first (:mod:`.ledger.replay_queue`). Both are built from a :class:`~airflow_kafka_backpressure.config.pipeline.PipelineConfig`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_kafka_backpressure.config.pipeline import PIPELINES_FILE_ENV, PipelineConfig, load_pipelines

from .operators import (
    ExecutorScalingOperator,
    MaintainTableOperator,
    PlanOffsetRangesOperator,
    RecordBatchMetricsOperator,
    ReplayCheckOperator,
    ReplayFailedRangesOperator,
    SparkKafkaBatchOperator,
)
from .operators.common import sink_lock_wait_s
from .sensors.failed_ranges import FailedRangesSensor

__all__ = [
    "PIPELINES_FILE_ENV",
    "PipelineConfig",
    "REPLAY_BATCHES_PER_RUN",
    "build_dags",
    "build_ingest_dag",
    "build_maintain_dag",
    "build_replay_dag",
    "load_pipelines",
    "task_timeouts",
]


def _doc(p: PipelineConfig) -> str:
    return f"""### Kafka → Spark micro-batches: `{p.name}`
Topics `{", ".join(p.topics)}` → `{p.sink}`, one batch every {p.batch_interval_s:g} s.

* **plan** — the batch's offset ranges, sized by the PID rate (XCom: the plan, with `rate` and `lag`).
* **ingest** — a bounded Spark job reads exactly those ranges and swaps its output in (XCom: metrics).
* **record** — feeds the metrics to the PID controller, commits consumer group `{p.group}` (XCom: the new rate).
* **scale** — sets the next job's executor count from processing time / batch interval (XCom: the decision).

Tune the controller in **Admin → Variables**: `{p.settings_variable}` (gains and limits, JSON).
State: `{p.controller_variable}` (PID), `{p.executors_variable}` (executor target).
Failed batches are replayed by the DAG `{p.replay_dag_id}`.
"""


#: Failed batches one replay run takes on (the rest wait for the next run): it bounds the run.
REPLAY_BATCHES_PER_RUN = 10


def task_timeouts(p: PipelineConfig) -> dict[str, timedelta]:
    """``execution_timeout`` of every task of the pipeline's two DAGs, derived from its batch interval
    and timeouts (set ``task_timeout_s``, ``batch_timeout_s``, ``replay_interval_s`` to change them).

    Each is a last resort above the task's own bounds (broker and ledger calls, the batch timeout, the
    wait for the table's commit lock where the sink needs one):
    a task that outlives it is killed by Airflow (its ``on_kill`` stops the Spark work) and fails."""
    control = p.control_task_timeout
    every = p.replay_interval_s or 5 * p.batch_interval_s
    # a batch into a table written one job at a time (Delta on S3) may first wait for another's job
    batch = p.batch_task_timeout + sink_lock_wait_s(p)
    return {
        "plan": timedelta(seconds=control),
        "ingest": timedelta(seconds=batch),
        "record": timedelta(seconds=control),
        "scale": timedelta(seconds=control),
        "failed_ranges": timedelta(seconds=every + control),
        "replay": timedelta(seconds=REPLAY_BATCHES_PER_RUN * batch + control),
        "check": timedelta(seconds=control),
        # the wait for a batch's job to release the table's lock, then the maintenance's own bound
        "maintain": timedelta(
            seconds=p.batch_task_timeout + (p.maintenance.timeout_s if p.maintenance else 0)
        ),
    }


def build_ingest_dag(p: PipelineConfig, **dag_kwargs: Any) -> DAG:
    args: dict[str, Any] = dict(
        dag_id=p.ingest_dag_id,
        schedule=timedelta(seconds=p.batch_interval_s),
        start_date=pendulum.parse(p.start_date),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0},
        tags=["kafka-backpressure", p.name, *p.tags],
        doc_md=_doc(p),
    )
    args.update(dag_kwargs)
    t = task_timeouts(p)
    with DAG(**args) as dag:
        plan = PlanOffsetRangesOperator(task_id="plan", pipeline=p, execution_timeout=t["plan"])
        ingest = SparkKafkaBatchOperator(task_id="ingest", pipeline=p, execution_timeout=t["ingest"])
        record = RecordBatchMetricsOperator(task_id="record", pipeline=p, execution_timeout=t["record"])
        scale = ExecutorScalingOperator(task_id="scale", pipeline=p, execution_timeout=t["scale"])
        plan >> ingest >> record >> scale
    return dag


def build_replay_dag(p: PipelineConfig, **dag_kwargs: Any) -> DAG:
    every = p.replay_interval_s or 5 * p.batch_interval_s
    args: dict[str, Any] = dict(
        dag_id=p.replay_dag_id,
        schedule=timedelta(seconds=every),
        start_date=pendulum.parse(p.start_date),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0},
        tags=["kafka-backpressure", p.name, "replay", *p.tags],
        doc_md=f"Replays failed batches of pipeline `{p.name}` that are due (a batch whose replays keep failing waits a growing backoff), with the same ranges and sink path.",
    )
    args.update(dag_kwargs)
    t = task_timeouts(p)
    with DAG(**args) as dag:
        wait = FailedRangesSensor(
            execution_timeout=t["failed_ranges"],
            task_id="failed_ranges",
            pipeline=p,
            deferrable=p.replay_deferrable,
            poke_interval=max(1.0, min(30.0, every / 4)),
            timeout=max(1.0, every * 0.9),
            soft_fail=True,  # nothing failed in this window: the run is skipped, not failed
        )
        replay = ReplayFailedRangesOperator(
            task_id="replay", pipeline=p, max_batches=REPLAY_BATCHES_PER_RUN, execution_timeout=t["replay"]
        )
        # fails the run when batches could not be replayed; the replay task succeeds, so that the
        # Asset events of the batches it did replay are sent (Airflow sends them only on success)
        check = ReplayCheckOperator(
            task_id="check", pipeline=p, replay_task_id="replay", execution_timeout=t["check"]
        )
        wait >> replay >> check
    return dag


def build_maintain_dag(p: PipelineConfig, **dag_kwargs: Any) -> DAG:
    """The table's maintenance (``p.maintenance``: its schedule, retention, file size, order)."""
    if p.maintenance is None:
        raise ValueError(f"pipeline {p.name!r} has no maintenance: it has no maintenance DAG")
    m = p.maintenance
    args: dict[str, Any] = dict(
        dag_id=p.maintain_dag_id,
        schedule=m.schedule,
        start_date=pendulum.parse(p.start_date),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0},
        tags=["kafka-backpressure", p.name, "maintenance", *p.tags],
        doc_md=(
            f"Maintains the {p.sink_format} table `{p.sink}` of pipeline `{p.name}`: compacts each partition's "
            f"small files into files of about {m.target_file_mb} MB"
            + (f" ordered by `{m.sort_by}`" if m.sort_by else "")
            + f", expires snapshots and deletes unreferenced files older than {m.retention_hours:g} h. It holds "
            "the table's ledger lock: batches wait for it, and it waits for a batch's job."
        ),
    )
    args.update(dag_kwargs)
    with DAG(**args) as dag:
        MaintainTableOperator(task_id="maintain", pipeline=p, execution_timeout=task_timeouts(p)["maintain"])
    return dag


def build_dags(pipelines: Iterable[PipelineConfig]) -> dict[str, DAG]:
    dags: dict[str, DAG] = {}
    for p in pipelines:
        built = [build_ingest_dag(p), build_replay_dag(p)]
        if p.maintenance is not None:
            built.append(build_maintain_dag(p))
        for dag in built:
            dags[dag.dag_id] = dag
    return dags
