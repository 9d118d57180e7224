"""FailedRangesTrigger: wait, without a worker slot, until a pipeline has batches to replay.

It stores the ledger's *connection id* (None: the default SQLite ledger), never its URL: trigger
arguments are kept in Airflow's trigger table and shown in logs, and a URL carries the password.
The triggerer resolves the connection when it checks.
"""

from __future__ import annotations

from typing import Any

from .polling import PollingTrigger


def replayable_batch_ids(
    ledger_conn_id: str | None,
    pipeline: str,
    stale_before_ms: int | None,
    backoff_base_ms: int | None = None,
) -> list[int]:
    """The batches due for a replay (``backoff_base_ms`` None: every replayable batch, as a trigger
    deferred before the replay backoff existed checks)."""
    from ..hooks.ledger import LedgerHook  # defers the hook and SQLAlchemy: in the triggerer, when it checks

    ledger = LedgerHook(ledger_conn_id).get_conn()
    if backoff_base_ms is None:
        return [b.batch_id for b in ledger.replayable_batches(pipeline, stale_before_ms)]
    return [
        b.batch_id
        for b in ledger.replay_queue(pipeline, stale_before_ms, backoff_base_ms=backoff_base_ms).due
    ]


class FailedRangesTrigger(PollingTrigger):
    """Polls the ledger; fires ``found`` with ``batch_ids``, ``timeout`` at ``deadline_ms``, or ``error``.

    ``ledger_url`` is read only so that deferrals stored by version 0.1.0 (which kept the URL) resume
    after an upgrade; new triggers never store it.
    """

    def __init__(
        self,
        ledger_conn_id: str | None = None,
        pipeline: str = "",
        stale_before_ms: int | None = None,
        poll_interval_s: float = 30.0,
        deadline_ms: int | None = None,
        *,
        ledger_url: str | None = None,
        backoff_base_ms: int | None = None,
    ):
        super().__init__(poll_interval_s, deadline_ms)
        if not pipeline:
            raise ValueError("FailedRangesTrigger needs the pipeline's name")
        self.ledger_conn_id = ledger_conn_id
        self.pipeline = pipeline
        self.stale_before_ms = stale_before_ms
        self.backoff_base_ms = backoff_base_ms
        self._legacy_url = ledger_url

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "ledger_conn_id": self.ledger_conn_id,
            "pipeline": self.pipeline,
            "stale_before_ms": self.stale_before_ms,
            "poll_interval_s": self.poll_interval_s,
            "deadline_ms": self.deadline_ms,
        }
        if self.backoff_base_ms is not None:
            kwargs["backoff_base_ms"] = self.backoff_base_ms
        if self._legacy_url is not None:  # a 0.1.0 deferral being resumed: it has nothing else
            kwargs["ledger_url"] = self._legacy_url
        return "airflow_kafka_backpressure.triggers.failed_ranges.FailedRangesTrigger", kwargs

    def check(self) -> dict[str, Any] | None:
        if self._legacy_url is not None:
            from ..hooks.ledger import ledger_for_url  # defers SQLAlchemy: in the triggerer, when it checks

            ids = [
                b.batch_id
                for b in ledger_for_url(self._legacy_url).replayable_batches(
                    self.pipeline, self.stale_before_ms
                )
            ]
        else:
            ids = replayable_batch_ids(
                self.ledger_conn_id, self.pipeline, self.stale_before_ms, self.backoff_base_ms
            )
        return {"batch_ids": ids} if ids else None
