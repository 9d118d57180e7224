"""ExecutorScalingOperator: the next job's executor count from recent processing ratios."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..ledger import SUCCEEDED
from .base import PipelineOperator
from .common import (
    load_controller,
    load_executor_target,
    load_settings,
    save_executor_target,
    state_lock,
)


class ExecutorScalingOperator(PipelineOperator):
    """Decide the next job's executor count from the batches since the last change.

    The trigger is Spark Streaming's dynamic-allocation rule: the average processing time of the
    last ``scaling_window_batches`` successful batches (since the target last changed) over the
    batch interval, >= the up ratio or <= the down ratio; a cooldown holds the target for a few
    batches after each change. In the ``spark`` mode Spark's rule decides the count. In the
    ``cost`` mode the cost model does: executors are added only when the per-record work dominates
    a batch (they do not shorten start-up), as many as bring the average batch to the target
    ratio, and removed only when one fewer still fits the target; the decision's reason says which.
    """

    ui_color = "#f3e8fd"

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        # read-modify-write of the executor-target Variable: concurrent runs apply theirs in turn
        with state_lock(p, self.ledger, p.executors_variable):
            return self._scale(p)

    def _scale(self, p: PipelineConfig) -> dict[str, Any]:
        settings = load_settings(p)
        state = load_executor_target(p, settings)
        current = state["executors"]
        changed_after = state.get("changed_after_batch")

        batches = [
            b
            for b in self.ledger.recent_batches(p.name, limit=200, statuses=[SUCCEEDED])
            if b.processing_ms is not None and (changed_after is None or b.batch_id > changed_after)
        ]
        window = batches[: settings.scaling_window_batches]
        if not settings.scaling_enabled:
            decision = {
                "target": current,
                "action": "hold",
                "ratio": None,
                "reason": "scaling_enabled is false",
            }
        else:
            since = None if changed_after is None else len(batches)
            # the active mode's rule (control.modes.REGISTRY): Spark's, or the cost model's judgement
            d = load_controller(p, settings).suggest_executors(
                current,
                [(b.records or 0, b.processing_ms) for b in window if b.processing_ms is not None],
                p.batch_interval_ms,
                settings.cost_params(),
                settings.scaling_policy(),
                since,
            )
            decision = d.to_dict()
        if decision["target"] != current:
            state = {
                "executors": decision["target"],
                "changed_after_batch": batches[0].batch_id if batches else changed_after,
                "previous": current,
            }
        else:
            state = {**state, "executors": current}
        state["last_decision"] = decision
        save_executor_target(p, state)
        self.log.info("Executor target %s -> %s: %s", current, decision["target"], decision["reason"])
        return {**decision, "previous": current, "window_batch_ids": [b.batch_id for b in window]}
