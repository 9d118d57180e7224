"""SparkKafkaBatchOperator: run the planned batch as a bounded Spark job."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..models import BatchMetrics
from ..pipeline import PipelineConfig
from .common import as_pipeline, ledger_for, load_executor_target, load_settings
from .spark_job import submit_batch


class SparkKafkaBatchOperator(BaseOperator):
    """Submit the batch planned for this DAG run through SparkSubmitHook and return its metrics.

    The plan is the ledger's for (pipeline, run id). The executor count is the pipeline's executor
    target Variable. The batch is marked running, then succeeded — only after the sink swap — or
    failed with the job's error, which makes it replayable.
    """

    ui_color = "#fdf1e3"

    def __init__(self, *, pipeline: PipelineConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)

    def execute(self, context: Context) -> dict[str, Any]:
        from ..hooks.kafka_offsets import KafkaOffsetsHook

        p = self.pipeline
        ledger = ledger_for(p)
        plan = ledger.get_plan(p.name, context["run_id"])
        if plan is None:
            raise RuntimeError(
                f"No batch is planned for run {context['run_id']!r} of pipeline {p.name!r}: run the plan task first."
            )
        try:
            settings = load_settings(p)
            executors = load_executor_target(p, settings)["executors"]
            kafka_props = KafkaOffsetsHook(p.kafka_conn_id).client_properties()
        except Exception as e:  # the batch must not wait a day to be found: it is replayable now
            ledger.mark_failed(plan.batch_id, f"before the job started: {type(e).__name__}: {e}")
            raise

        ledger.mark_running(plan.batch_id, executors=executors)
        if plan.records == 0:
            # nothing to read: no Spark application for an idle topic, the batch is done
            now = int(time.time() * 1000)
            metrics = BatchMetrics(plan.batch_id, 0, 0, now, now, now, 0)
            ledger.mark_succeeded(plan.batch_id, 0, 0, at_ms=now)
            self.log.info("Batch %s is empty: no job submitted", plan.batch_id)
            return metrics.to_dict()
        try:
            metrics = submit_batch(
                p, plan, executors, kafka_props, attempt=f"ingest-{context['ti'].try_number}", task_log=self.log
            )
        except BaseException as e:
            ledger.mark_failed(plan.batch_id, getattr(e, "job_message", None) or f"{type(e).__name__}: {e}")
            raise
        ledger.mark_succeeded(plan.batch_id, metrics.records, metrics.processing_ms, at_ms=metrics.committed_at_ms)
        ledger.record_metrics(plan.batch_id, executors=metrics.executors)  # measured, not just the target
        self.log.info(
            "Batch %s: %s records in %s ms with %s executor(s)",
            plan.batch_id, metrics.records, metrics.processing_ms, metrics.executors,
        )
        return metrics.to_dict()
