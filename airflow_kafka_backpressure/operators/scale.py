"""ExecutorScalingOperator: the next job's executor count from recent processing ratios."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Context

from ..control.scaling import executor_target
from ..ledger import SUCCEEDED
from ..pipeline import PipelineConfig
from .common import as_pipeline, ledger_for, load_executor_target, load_settings, save_executor_target


class ExecutorScalingOperator(BaseOperator):
    """Apply Spark Streaming's dynamic-allocation rules to the batches since the last change.

    The average processing time of the last ``scaling_window_batches`` successful batches (since
    the target last changed) over the batch interval: >= the up ratio adds executors, <= the down
    ratio removes one; a cooldown holds the target for a few batches after each change.
    """

    ui_color = "#f3e8fd"

    def __init__(self, *, pipeline: PipelineConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        settings = load_settings(p)
        state = load_executor_target(p, settings)
        current = state["executors"]
        changed_after = state.get("changed_after_batch")

        batches = [
            b
            for b in ledger_for(p).recent_batches(p.name, limit=200, statuses=[SUCCEEDED])
            if b.processing_ms is not None and (changed_after is None or b.batch_id > changed_after)
        ]
        window = batches[: settings.scaling_window_batches]
        if not settings.scaling_enabled:
            decision = {"target": current, "action": "hold", "ratio": None, "reason": "scaling_enabled is false"}
        else:
            d = executor_target(
                current,
                [b.processing_ms for b in window],
                p.batch_interval_ms,
                settings.scaling_policy(),
                batches_since_change=None if changed_after is None else len(batches),
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
