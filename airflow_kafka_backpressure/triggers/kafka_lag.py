"""KafkaLagTrigger: wait, without a worker slot, until a pipeline's lag crosses a threshold.

It stores connection ids (Kafka, ledger) and the pipeline's topics and group, never URLs or
secrets; the triggerer resolves the connections when it checks. See :mod:`..lag` for the figures.
"""

from __future__ import annotations

from typing import Any

from ..kafka.lag import LagThresholds, measure_lag
from .polling import PollingTrigger


def lag_report(
    *,
    pipeline: str,
    topics: list[str],
    group: str,
    kafka_conn_id: str,
    ledger_conn_id: str | None,
    starting_offsets: str,
    thresholds: LagThresholds,
    timeout_s: float,
):
    """Measure the pipeline's lag through the hooks (connections resolved here)."""
    # defers the hooks' Kafka and SQL clients: in the triggerer, when it checks
    from ..hooks.kafka_offsets import KafkaOffsetsHook
    from ..hooks.ledger import LedgerHook

    with KafkaOffsetsHook(kafka_conn_id, timeout_s=timeout_s).get_conn() as kafka:
        return measure_lag(
            kafka,
            LedgerHook(ledger_conn_id).get_conn(),
            pipeline=pipeline,
            topics=topics,
            group=group,
            starting_offsets=starting_offsets,
            retention_margin_records=int(thresholds.retention_margin_records or 0),
            with_timestamps=thresholds.needs_timestamps,
        )


class KafkaLagTrigger(PollingTrigger):
    """Fires ``found`` with ``reasons`` and the lag ``report`` when a threshold is crossed,
    ``timeout`` at ``deadline_ms``, or ``error`` (e.g. the broker did not answer within ``timeout_s``)."""

    def __init__(
        self,
        *,
        pipeline: str,
        topics: list[str],
        group: str,
        kafka_conn_id: str,
        ledger_conn_id: str | None,
        starting_offsets: str,
        thresholds: dict[str, Any],
        poll_interval_s: float = 60.0,
        deadline_ms: int | None = None,
        timeout_s: float = 10.0,
    ):
        super().__init__(poll_interval_s, deadline_ms)
        self.pipeline = pipeline
        self.topics = list(topics)
        self.group = group
        self.kafka_conn_id = kafka_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.starting_offsets = starting_offsets
        self.thresholds = LagThresholds(**thresholds)
        self.timeout_s = timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_kafka_backpressure.triggers.kafka_lag.KafkaLagTrigger",
            {
                "pipeline": self.pipeline,
                "topics": self.topics,
                "group": self.group,
                "kafka_conn_id": self.kafka_conn_id,
                "ledger_conn_id": self.ledger_conn_id,
                "starting_offsets": self.starting_offsets,
                "thresholds": self.thresholds.to_dict(),
                "poll_interval_s": self.poll_interval_s,
                "deadline_ms": self.deadline_ms,
                "timeout_s": self.timeout_s,
            },
        )

    def check(self) -> dict[str, Any] | None:
        report = lag_report(
            pipeline=self.pipeline,
            topics=self.topics,
            group=self.group,
            kafka_conn_id=self.kafka_conn_id,
            ledger_conn_id=self.ledger_conn_id,
            starting_offsets=self.starting_offsets,
            thresholds=self.thresholds,
            timeout_s=self.timeout_s,
        )
        reasons = self.thresholds.crossed(report)
        return {"reasons": reasons, "report": report.to_dict()} if reasons else None
