"""FailedRangesSensor: succeeds when the pipeline's ledger holds batches to replay."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

from ..pipeline import PipelineConfig
from ..operators.common import as_pipeline, ledger_for
from ..operators.replay import stale_before_ms


class FailedRangesSensor(BaseSensorOperator):
    """Wait for failed (or abandoned) batches; returns their ids, earliest first, as XCom.

    ``deferrable=True`` hands the wait to :class:`FailedRangesTrigger`, freeing the worker slot.
    """

    ui_color = "#fff3cd"

    def __init__(
        self, *, pipeline: PipelineConfig | dict[str, Any], deferrable: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)
        self.deferrable = deferrable

    def poke(self, context: Context) -> PokeReturnValue:
        p = self.pipeline
        ids = [b.batch_id for b in ledger_for(p).replayable_batches(p.name, stale_before_ms(p))]
        if ids:
            self.log.info("Batches to replay for %s: %s", p.name, ids)
        return PokeReturnValue(is_done=bool(ids), xcom_value=ids or None)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from ..hooks.ledger import LedgerHook
        from ..triggers.failed_ranges import FailedRangesTrigger

        found = self.poke(context)
        if found.is_done:
            return found.xcom_value
        p = self.pipeline
        deadline_ms = int(time.time() * 1000 + float(self.timeout) * 1000) if self.timeout else None
        self.defer(
            trigger=FailedRangesTrigger(
                LedgerHook(p.ledger_conn_id).url(), p.name, stale_before_ms(p), float(self.poke_interval), deadline_ms
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> list[int]:
        if event and event.get("status") == "timeout":
            message = f"No failed batches of pipeline {self.pipeline.name!r} within {self.timeout}s"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        if not event or event.get("status") != "found":
            raise RuntimeError(
                f"Failed-ranges trigger of pipeline {self.pipeline.name!r} stopped: "
                f"{(event or {}).get('message', 'no event')}"
            )
        return list(event["batch_ids"])
