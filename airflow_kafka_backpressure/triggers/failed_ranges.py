"""FailedRangesTrigger: wait, without a worker slot, until a pipeline has batches to replay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


def replayable_batch_ids(ledger_url: str, pipeline: str, stale_before_ms: int | None) -> list[int]:
    from ..hooks.ledger import ledger_for_url

    return [b.batch_id for b in ledger_for_url(ledger_url).replayable_batches(pipeline, stale_before_ms)]


class FailedRangesTrigger(BaseTrigger):
    """Polls the ledger; fires ``found`` with the batch ids, ``timeout`` at ``deadline_ms`` (epoch ms),
    or ``error``. The trigger keeps its own deadline, so the wait ends even where no scheduler
    enforces the deferral timeout (``dag.test()`` runs triggers inline)."""

    def __init__(
        self,
        ledger_url: str,
        pipeline: str,
        stale_before_ms: int | None,
        poll_interval_s: float = 30.0,
        deadline_ms: int | None = None,
    ):
        super().__init__()
        self.ledger_url = ledger_url
        self.pipeline = pipeline
        self.stale_before_ms = stale_before_ms
        self.poll_interval_s = poll_interval_s
        self.deadline_ms = deadline_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_kafka_backpressure.triggers.failed_ranges.FailedRangesTrigger",
            {
                "ledger_url": self.ledger_url,
                "pipeline": self.pipeline,
                "stale_before_ms": self.stale_before_ms,
                "poll_interval_s": self.poll_interval_s,
                "deadline_ms": self.deadline_ms,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                ids = await asyncio.to_thread(
                    replayable_batch_ids, self.ledger_url, self.pipeline, self.stale_before_ms
                )
            except Exception as e:  # report, do not spin: the sensor fails with the message
                yield TriggerEvent({"status": "error", "message": f"{type(e).__name__}: {e}"})
                return
            if ids:
                yield TriggerEvent({"status": "found", "batch_ids": ids})
                return
            now_ms = time.time() * 1000
            if self.deadline_ms is not None and now_ms >= self.deadline_ms:
                yield TriggerEvent({"status": "timeout"})
                return
            wait_s = self.poll_interval_s
            if self.deadline_ms is not None:
                wait_s = min(wait_s, max((self.deadline_ms - now_ms) / 1000, 0.0))
            await asyncio.sleep(wait_s)
