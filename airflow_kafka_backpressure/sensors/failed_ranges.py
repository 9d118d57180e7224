"""FailedRangesSensor: succeeds when the pipeline's ledger holds batches to replay."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context, PokeReturnValue

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..operators.common import as_pipeline, ledger_for
from ..operators.replay import replay_backoff_base_ms, stale_before_ms
from .deferrable import DeferrablePollingSensor


class FailedRangesSensor(DeferrablePollingSensor):
    """Wait for failed (or abandoned) batches due for a replay; returns their ids, in the order the
    replay takes them, as XCom. Batches waiting for their backoff after failed replays do not count
    (:mod:`..ledger.replay_queue`): while only those are left, the run is skipped.

    ``deferrable=True`` hands the wait to :class:`FailedRangesTrigger`, freeing the worker slot; the
    trigger stores the ledger's connection id, never its URL.
    """

    ui_color = "#fff3cd"

    def __init__(self, *, pipeline: PipelineConfig | dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)

    def poke(self, context: Context) -> PokeReturnValue:
        p = self.pipeline
        queue = ledger_for(p).replay_queue(
            p.name, stale_before_ms(p), backoff_base_ms=replay_backoff_base_ms(p)
        )
        ids = [b.batch_id for b in queue.due]
        if ids:
            self.log.info("Batches to replay for %s: %s", p.name, ids)
        return PokeReturnValue(is_done=bool(ids), xcom_value=ids or None)

    def trigger(self, deadline_ms: int | None) -> Any:
        # defers core Airflow's trigger machinery: only when deferring
        from ..triggers.failed_ranges import FailedRangesTrigger

        p = self.pipeline
        return FailedRangesTrigger(
            p.ledger_conn_id,
            p.name,
            stale_before_ms(p),
            float(self.poke_interval),
            deadline_ms,
            backoff_base_ms=replay_backoff_base_ms(p),
        )

    def result(self, event: dict[str, Any]) -> list[int]:
        return list(event["batch_ids"])

    def waiting_for(self) -> str:
        return f"Failed batches of pipeline {self.pipeline.name!r}"
