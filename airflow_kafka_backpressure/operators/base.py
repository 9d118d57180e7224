"""The base of every operator of a pipeline: its connections as template fields, its hooks as cached
properties — the shape of the official Kafka and Spark providers' operators.

A pipeline (:class:`~airflow_kafka_backpressure.config.pipeline.PipelineConfig`) names its connections and
topics; an operator may override them per task, with Jinja (``"{{ var.value.kafka_conn }}"``). The
rendered values are what :attr:`PipelineOperator.pipeline` holds inside ``execute()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..hooks.kafka_offsets import KafkaOffsetsHook
from ..hooks.ledger import LedgerHook
from ..ledger import Ledger


class PipelineOperator(BaseOperator):
    """An operator of one pipeline. ``kafka_conn_id``, ``ledger_conn_id`` and ``topics`` default to
    the pipeline's and are template fields."""

    template_fields: Sequence[str] = ("kafka_conn_id", "ledger_conn_id", "topics")

    def __init__(
        self,
        *,
        pipeline: PipelineConfig | dict[str, Any],
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        topics: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._pipeline = (
            pipeline if isinstance(pipeline, PipelineConfig) else PipelineConfig.from_dict(dict(pipeline))
        )
        self.kafka_conn_id = kafka_conn_id or self._pipeline.kafka_conn_id
        self.ledger_conn_id = ledger_conn_id if ledger_conn_id is not None else self._pipeline.ledger_conn_id
        self.topics = list(topics or self._pipeline.topics)

    def _overrides(self) -> dict[str, Any]:
        return {
            "kafka_conn_id": self.kafka_conn_id,
            "ledger_conn_id": self.ledger_conn_id,
            "topics": tuple(self.topics),
        }

    @property
    def pipeline(self) -> PipelineConfig:
        """The pipeline with this task's (rendered) connection ids and topics."""
        return replace(self._pipeline, **self._overrides())

    @cached_property
    def kafka_hook(self) -> KafkaOffsetsHook:
        return KafkaOffsetsHook(self.kafka_conn_id, timeout_s=self._pipeline.kafka_timeout_s)

    @cached_property
    def ledger_hook(self) -> LedgerHook:
        return LedgerHook(self.ledger_conn_id)

    @cached_property
    def ledger(self) -> Ledger:
        """The pipeline's ledger (:class:`~airflow_kafka_backpressure.ledger.Ledger`)."""
        return self.ledger_hook.get_conn()
