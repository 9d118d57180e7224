"""ReplayFailedRangesOperator: re-run failed batches, earliest first, exactly as planned."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from ..pipeline import DEFAULT_STALE_AFTER_S, PipelineConfig
from .batch import BatchRunningOperator
from .common import commit_progress, load_executor_target, load_settings


def stale_before_ms(pipeline: PipelineConfig, now_ms: int | None = None) -> int:
    """Batches planned or running with no activity since this time are treated as abandoned."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - int((pipeline.stale_after_s or DEFAULT_STALE_AFTER_S) * 1000)


class ReplayFailedRangesOperator(BatchRunningOperator):
    """Replay the pipeline's failed batches, earliest first, with the same batch id and sink path.

    Each batch is claimed in the ledger (failed → replaying; a concurrent replayer cannot claim it
    too), run with the plan it was given, and marked replayed once its output is swapped in. The
    first failure stops the replay (the batch is marked failed again with the new error). At the end
    the consumer group is committed up to the contiguous finished offsets.
    """

    ui_color = "#fde8e8"

    def __init__(self, *, pipeline: PipelineConfig | dict[str, Any], max_batches: int | None = None, **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.max_batches = max_batches

    def execute(self, context: Context) -> list[dict[str, Any]]:
        p = self.pipeline
        ledger = self.ledger
        stale = stale_before_ms(p)
        todo = ledger.replayable_batches(p.name, stale_before_ms=stale)
        if self.max_batches is not None:
            todo = todo[: self.max_batches]
        if not todo:
            self.log.info("Nothing to replay for pipeline %s", p.name)
            return []
        settings = load_settings(p)
        executors = load_executor_target(p, settings)["executors"]
        kafka_props = self.kafka_hook.client_properties()

        replayed: list[dict[str, Any]] = []
        try:
            for batch in todo:
                self.log.info(
                    "Replaying batch %s (%s, planned by run %s): %s",
                    batch.batch_id, batch.status, batch.run_id, ", ".join(str(r) for r in batch.ranges if r.count),
                )
                token = self.claim(ledger, batch.batch_id, replay=True, stale_before_ms=stale)
                metrics = self.run_and_mark(ledger, batch.plan, executors, kafka_props, token=token, replay=True)
                replayed.append({"batch_id": batch.batch_id, "records": metrics.records, "processing_ms": metrics.processing_ms})
        finally:
            if replayed:
                with self.kafka_hook.get_conn() as kafka:
                    committed = commit_progress(p, ledger, kafka)
                self.log.info("Committed group %s: %s", p.group, committed)
        self.emit_events(context)
        return replayed
