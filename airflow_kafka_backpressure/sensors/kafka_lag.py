"""KafkaLagSensor: waits until a pipeline falls behind — lag in records, seconds behind, or a
partition's position close to the earliest offset retention keeps (definitions: :mod:`..lag`)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context, PokeReturnValue

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..kafka.lag import LagThresholds
from .deferrable import DeferrablePollingSensor


class KafkaLagSensor(DeferrablePollingSensor):
    """Succeed when any threshold is crossed; return ``{"reasons": [...], "report": {...}}`` (XCom).

    ``deferrable`` (a keyword of the base sensor): wait in the triggerer
    (:class:`~..triggers.kafka_lag.KafkaLagTrigger`, which stores connection ids, never URLs)
    instead of a worker slot.

    :param pipeline: the pipeline (its topics, consumer group, Kafka and ledger connections).
    :param max_lag_records: fire when the pipeline's total lag (latest - committed position, summed
        over its partitions) is above this.
    :param max_seconds_behind: fire when a partition's oldest unwritten record (by its Kafka
        timestamp) is older than this many seconds.
    :param retention_margin_records: fire when a partition with unread data has its position within
        this many records of the earliest offset the broker still keeps (0: at it, or past it).
    :param broker_timeout_s: bound of every broker request of one check.
    """

    ui_color = "#fde2e4"

    def __init__(
        self,
        *,
        pipeline: PipelineConfig | dict[str, Any],
        max_lag_records: int | None = None,
        max_seconds_behind: float | None = None,
        retention_margin_records: int | None = None,
        broker_timeout_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = (
            pipeline if isinstance(pipeline, PipelineConfig) else PipelineConfig.from_dict(dict(pipeline))
        )
        self.max_lag_records = max_lag_records
        self.max_seconds_behind = max_seconds_behind
        self.retention_margin_records = retention_margin_records
        self.broker_timeout_s = broker_timeout_s
        self.thresholds()  # a bad threshold fails at DAG parse time, naming it

    def thresholds(self) -> LagThresholds:
        try:
            return LagThresholds(self.max_lag_records, self.max_seconds_behind, self.retention_margin_records)
        except ValueError as e:
            raise ValueError(
                f"KafkaLagSensor {self.task_id!r} of pipeline {self.pipeline.name!r}: {e}"
            ) from None

    def _trigger_args(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "pipeline": p.name,
            "topics": list(p.topics),
            "group": p.group,
            "kafka_conn_id": p.kafka_conn_id,
            "ledger_conn_id": p.ledger_conn_id,
            "starting_offsets": p.starting_offsets,
        }

    def poke(self, context: Context) -> PokeReturnValue:
        # defers the hooks' Kafka and SQL clients: only when poking
        from ..triggers.kafka_lag import lag_report

        thresholds = self.thresholds()
        report = lag_report(**self._trigger_args(), thresholds=thresholds, timeout_s=self.broker_timeout_s)
        reasons = thresholds.crossed(report)
        self.log.info(
            "Pipeline %s: lag %s records, max %s s behind, at risk: %s",
            self.pipeline.name,
            report.total_lag,
            report.max_seconds_behind,
            [str(p.tp) for p in report.at_risk],
        )
        if not reasons:
            return PokeReturnValue(is_done=False)
        for reason in reasons:
            self.log.warning("%s", reason)
        return PokeReturnValue(is_done=True, xcom_value={"reasons": reasons, "report": report.to_dict()})

    def trigger(self, deadline_ms: int | None) -> Any:
        # defers core Airflow's trigger machinery: only when deferring
        from ..triggers.kafka_lag import KafkaLagTrigger

        return KafkaLagTrigger(
            **self._trigger_args(),
            thresholds=self.thresholds().to_dict(),
            poll_interval_s=float(self.poke_interval),
            deadline_ms=deadline_ms,
            timeout_s=self.broker_timeout_s,
        )

    def result(self, event: dict[str, Any]) -> dict[str, Any]:
        for reason in event["reasons"]:
            self.log.warning("%s", reason)
        return {"reasons": event["reasons"], "report": event["report"]}

    def waiting_for(self) -> str:
        return f"Lag of pipeline {self.pipeline.name!r} (Kafka connection {self.pipeline.kafka_conn_id!r})"
