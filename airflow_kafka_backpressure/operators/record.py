"""RecordBatchMetricsOperator: feed the finished batch to the controller and commit progress."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Context

from airflow_kafka_backpressure.batch.models import RETURN_VALUE_KEY, BatchMetrics, BatchPlan
from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..ledger import Ledger
from .base import PipelineOperator
from .common import (
    commit_progress,
    load_controller,
    load_settings,
    save_controller,
    state_lock,
)

#: The record task's return value (XCom): what the batch fed the controller, and what followed —
#: ``batch_id``, ``records``, ``processing_ms``, ``scheduling_delay_ms``, ``mode``, ``warning``,
#: ``committed`` (the consumer group's new offsets by topic-partition), ``pruned_batches``, and every
#: control mode's figures (:meth:`~..control.modes.ControlMode.report`: the spark mode's
#: ``estimated_rate``, ``rate_limit_before``, ``rate_limit``; the cost mode's ``cost`` fit and
#: ``cost_event``).
RecordResult = dict[str, Any]


def scheduling_delay_ms(dag_run: Any, plan: BatchPlan | None) -> int:
    """How late a scheduled run started against its scheduled time: when its batch was first
    planned (``plan.planned_at_ms``) minus when the run was due (``run_after``).

    0 for manual and backfill runs, whose scheduled time says nothing about the pipeline keeping
    up. The plan is stored once per run and reused by retries, cleared tasks and re-runs, so a run
    cleared a day later feeds the delay its first start had, not its age (the run's own
    ``start_date`` moves to the re-run). A cleared run (``clear_number`` > 0) whose plan was made
    only after it was cleared (its first attempt failed before planning) feeds 0: its plan's time is
    when someone cleared it, not how far the scheduler was behind — the rule of Airflow's own
    ``dagrun.first_task_scheduling_delay`` metric, which skips cleared runs. Without a plan: 0.
    """
    run_type = str(getattr(dag_run, "run_type", "") or "").lower()
    due = getattr(dag_run, "run_after", None)
    if "scheduled" not in run_type or due is None or plan is None:
        return 0
    if (getattr(dag_run, "clear_number", 0) or 0) > 0 and _planned_after_clear(dag_run, plan):
        return 0
    return max(plan.planned_at_ms - int(due.timestamp() * 1000), 0)


def _planned_after_clear(dag_run: Any, plan: BatchPlan) -> bool:
    """Whether the plan was made in the current (cleared) attempt of the run: at or after the run's
    current ``start_date`` (Airflow resets it when a finished run is cleared) — or, not knowing it,
    assume so."""
    started = getattr(dag_run, "start_date", None)
    if started is None:
        return True
    return plan.planned_at_ms >= int(started.timestamp() * 1000)


class RecordBatchMetricsOperator(PipelineOperator):
    """Update the controller from the ingest task's metrics, store them, commit the consumer group.

    Spark's inputs: time = sink commit time, elements = records read, processing delay = launch to
    commit, scheduling delay = how late the run first started (:func:`scheduling_delay_ms`). Both
    models are fed — Spark's PID and the cost model (with the executors the job ran with) — and
    saved to the pipeline's controller Variable; the cost model's fixed-cost warning is logged and
    stored there. The consumer group is committed only up to the end of the contiguous run of
    finished ranges, never past a failed one.

    The metrics are the return value of the task ``ingest_task_id`` (:meth:`BatchMetrics.to_xcom`),
    pulled from XCom as it was pushed — not rendered through a Jinja template, which would turn the
    dict into its string — or ``metrics`` given directly (a :class:`BatchMetrics` or its dict).
    """

    ui_color = "#eaf7ea"

    def __init__(
        self,
        *,
        pipeline: PipelineConfig | dict[str, Any],
        metrics: BatchMetrics | Mapping[str, Any] | None = None,
        ingest_task_id: str = "ingest",
        **kwargs: Any,
    ) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        if isinstance(metrics, str):
            raise TypeError(
                f"{self.task_id}: metrics must be a dict or BatchMetrics, not a string (a Jinja template "
                "renders a dict as its repr); to read another task's metrics, pass ingest_task_id"
            )
        self.metrics = (
            metrics
            if metrics is None or isinstance(metrics, BatchMetrics)
            else BatchMetrics.from_dict(dict(metrics))
        )
        self.ingest_task_id = ingest_task_id

    def _metrics(self, context: Context) -> BatchMetrics:
        """The batch's metrics: ``metrics`` if given, else the ingest task's XCom."""
        if self.metrics is not None:
            return self.metrics
        pushed = context["ti"].xcom_pull(task_ids=self.ingest_task_id, key=RETURN_VALUE_KEY)
        return BatchMetrics.from_xcom(pushed, task_id=self.ingest_task_id, key=RETURN_VALUE_KEY)

    def _prune(self, ledger: Ledger) -> int | None:
        """Apply the pipeline's ledger retention (``ledger_keep_batches``/``ledger_keep_days``) after
        the commit; returns the batches deleted (None: retention off, or it failed this time). A
        failure is logged, never fails the batch: the next record task tries again. Recorded losses
        outlive their batches; ``ledger_keep_losses_days`` is their own retention."""
        p = self.pipeline
        self._prune_losses(ledger)
        if p.ledger_keep_batches is None and p.ledger_keep_days is None:
            return None
        older_than_ms = None
        if p.ledger_keep_days is not None:
            older_than_ms = int((time.time() - p.ledger_keep_days * 86400) * 1000)
        try:
            result = ledger.prune(p.name, keep_batches=p.ledger_keep_batches, older_than_ms=older_than_ms)
        except Exception as e:  # noqa: BLE001 - housekeeping; the batch is committed already
            self.log.warning(
                "Pipeline %s: pruning the ledger failed (the next batch tries again): %s", p.name, e
            )
            return None
        if result.batches:
            self.log.info(
                "Pipeline %s: pruned %s finished batch(es) from the ledger (%s)",
                p.name,
                result.batches,
                result,
            )
        return int(result.batches)

    def _prune_losses(self, ledger: Ledger) -> None:
        p = self.pipeline
        if p.ledger_keep_losses_days is None:
            return
        older_than_ms = int((time.time() - p.ledger_keep_losses_days * 86400) * 1000)
        try:
            result = ledger.prune_losses(p.name, older_than_ms=older_than_ms)
        except Exception as e:  # noqa: BLE001 - housekeeping, as above
            self.log.warning(
                "Pipeline %s: pruning old recorded losses failed (the next batch tries again): %s", p.name, e
            )
            return
        if result.losses:
            self.log.info(
                "Pipeline %s: deleted %s recorded loss(es) older than %g days whose batches were pruned",
                p.name,
                result.losses,
                p.ledger_keep_losses_days,
            )

    def execute(self, context: Context) -> RecordResult:
        p = self.pipeline
        metrics = self._metrics(context)
        settings = load_settings(p)
        ledger = self.ledger
        plan = ledger.get_plan(p.name, context["run_id"])
        if plan is None:
            self.log.warning("No stored plan for run %s: scheduling delay taken as 0", context["run_id"])
        delay = scheduling_delay_ms(context["dag_run"], plan)

        with state_lock(p, ledger, p.controller_variable):  # read-modify-write of the state Variable
            controller = load_controller(p, settings)
            feedback = controller.on_batch_completed(
                batch_id=metrics.batch_id,
                time_ms=metrics.committed_at_ms,
                records=metrics.records,
                processing_ms=metrics.processing_ms,
                scheduling_delay_ms=delay,
                executors=metrics.executors,
                window_batches=settings.cost_window_batches,
                # the cost mode's correction: what the plan's budget left behind
                params=settings.cost_params(),
                left_behind=None if plan is None else plan.lag,
                budget=None if plan is None or not plan.rate else plan.rate * p.batch_interval_s,
                batch_interval_s=p.batch_interval_s,
                # launch to the first record read: fixed cost by construction (the cost mode fits
                # the time after it), so a cold start is not taken for slow records
                startup_ms=metrics.startup_ms,
            )
            save_controller(p, controller, settings)

        ledger.record_metrics(metrics.batch_id, scheduling_delay_ms=delay)
        with self.kafka_hook.get_conn() as kafka:
            committed = commit_progress(p, ledger, kafka)
        pruned = self._prune(ledger)
        warning = controller.warning(p.batch_interval_s)
        result: RecordResult = {
            "batch_id": metrics.batch_id,
            "records": metrics.records,
            "processing_ms": metrics.processing_ms,
            "scheduling_delay_ms": delay,
            "mode": controller.mode,
            **controller.report(feedback),  # every mode's figures: the PID's rate limit, the cost fit …
            "warning": warning,
            "committed": committed,
            "pruned_batches": pruned,
        }
        self.log.info(
            "Batch %s: %s records, %s ms processing, %s ms scheduling delay -> %s",
            metrics.batch_id,
            metrics.records,
            metrics.processing_ms,
            delay,
            controller.summary(),
        )
        for event in controller.events(feedback):
            self.log.info("Pipeline %s: %s", p.name, event)
        if warning:
            self.log.warning("Pipeline %s: %s", p.name, warning)
        return result
