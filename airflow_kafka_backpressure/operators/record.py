"""RecordBatchMetricsOperator: feed the finished batch to the PID controller and commit progress."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Context

from ..models import BatchMetrics
from ..pipeline import PipelineConfig
from .common import (
    as_pipeline,
    commit_progress,
    kafka_for,
    ledger_for,
    load_controller,
    load_settings,
    save_controller,
)


def scheduling_delay_ms(dag_run: Any) -> int:
    """How late a scheduled run started against its scheduled time (0 for manual and backfill runs,
    whose scheduled time says nothing about the pipeline keeping up)."""
    run_type = str(getattr(dag_run, "run_type", "") or "").lower()
    start, due = getattr(dag_run, "start_date", None), getattr(dag_run, "run_after", None)
    if "scheduled" not in run_type or start is None or due is None:
        return 0
    return max(int((start - due).total_seconds() * 1000), 0)


class RecordBatchMetricsOperator(BaseOperator):
    """Update the controller from the ingest task's metrics, store them, commit the consumer group.

    Spark's inputs: time = sink commit time, elements = records read, processing delay = launch to
    commit, scheduling delay = how late the run started. The PID state is saved to the pipeline's
    controller Variable. The consumer group is committed only up to the end of the contiguous run
    of finished ranges, never past a failed one.
    """

    template_fields = ("metrics",)
    ui_color = "#eaf7ea"

    def __init__(
        self,
        *,
        pipeline: PipelineConfig | dict[str, Any],
        metrics: Any = "{{ ti.xcom_pull(task_ids='ingest') }}",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)
        self.metrics = metrics

    def _metrics(self) -> BatchMetrics:
        import ast
        import json

        value = self.metrics
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = ast.literal_eval(value)  # a rendered Python dict
        if not isinstance(value, dict):
            raise ValueError(f"metrics must be the ingest task's XCom (a dict), got {type(value).__name__}")
        return BatchMetrics.from_dict(value)

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        metrics = self._metrics()
        settings = load_settings(p)
        controller = load_controller(p, settings)
        delay = scheduling_delay_ms(context["dag_run"])

        rate_before = controller.latest_rate
        new_rate = controller.on_batch_completed(
            metrics.committed_at_ms, metrics.records, metrics.processing_ms, delay
        )
        save_controller(p, controller)

        ledger = ledger_for(p)
        ledger.record_metrics(metrics.batch_id, scheduling_delay_ms=delay)
        with kafka_for(p) as kafka:
            committed = commit_progress(p, ledger, kafka)
        result = {
            "batch_id": metrics.batch_id,
            "records": metrics.records,
            "processing_ms": metrics.processing_ms,
            "scheduling_delay_ms": delay,
            "estimated_rate": new_rate,
            "rate_limit_before": rate_before,
            "rate_limit": controller.latest_rate,
            "committed": committed,
        }
        self.log.info(
            "Batch %s: %s records, %s ms processing, %s ms scheduling delay -> rate limit %s records/s",
            metrics.batch_id, metrics.records, metrics.processing_ms, delay, controller.latest_rate,
        )
        return result
