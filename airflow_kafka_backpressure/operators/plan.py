"""PlanOffsetRangesOperator: the next batch's offset ranges, sized by the PID rate."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..control.allocation import plan_ranges
from ..pipeline import PipelineConfig
from .common import as_pipeline, kafka_for, ledger_for, load_controller, load_settings


class PlanOffsetRangesOperator(BaseOperator):
    """Plan the batch of this DAG run and return it (XCom).

    Positions come from the ledger (the end of each partition's last range); a partition never
    planned starts at the consumer group's committed offset, else at ``starting_offsets``. The
    broker gives earliest and latest offsets; the controller's rate and the settings' limits size
    the ranges. The plan is stored under (pipeline, run id): a retry, a cleared task or a rerun of
    the same run returns the stored plan and never computes a new range.
    """

    ui_color = "#e8f4fd"

    def __init__(self, *, pipeline: PipelineConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        run_id = context["run_id"]
        ledger = ledger_for(p)

        stored = ledger.get_plan(p.name, run_id)
        if stored is not None:
            self.log.info("Run %s already has batch %s: reusing its ranges", run_id, stored.batch_id)
            return stored.to_dict()

        settings = load_settings(p)  # an invalid edit fails here, before anything is written
        controller = load_controller(p, settings)
        latest_rate = controller.latest_rate if settings.backpressure_enabled else None

        with kafka_for(p) as kafka:
            tps = kafka.partitions(p.topics)
            earliest = kafka.earliest_offsets(tps)
            latest = kafka.latest_offsets(tps)
            heads = {tp: o for tp, o in ledger.heads(p.name).items() if tp.topic in p.topics}
            new = [tp for tp in tps if tp not in heads]
            committed = kafka.committed_offsets(p.group, new) if new else {}

        allocation = plan_ranges(
            heads,
            earliest,
            latest,
            batch_interval_ms=p.batch_interval_ms,
            limits=settings.rate_limits(tps),
            latest_rate=latest_rate,
            committed=committed,
            starting_offsets=p.starting_offsets,
            on_data_loss=p.on_data_loss,
        )
        for loss in allocation.data_loss:
            self.log.warning(
                "Data loss on %s-%s: offsets [%s, %s) were deleted by retention before they were read",
                loss.topic, loss.partition, loss.from_offset, loss.until_offset,
            )
        lag_after = sum(latest[r.tp] - r.until_offset for r in allocation.ranges)
        plan = ledger.record_plan(
            p.name,
            run_id,
            allocation.ranges,
            p.sink,
            p.batch_interval_ms,
            int(time.time() * 1000),
            allocation.rate_limit,
            allocation.data_loss,
            lag=lag_after,
        )
        self.log.info(
            "Batch %s: %s records over %s partitions (rate limit %s records/s, %s records left behind)",
            plan.batch_id, plan.records, len(plan.ranges), allocation.rate_limit, lag_after,
        )
        return plan.to_dict()
