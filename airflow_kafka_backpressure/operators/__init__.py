"""Airflow operators of the pipeline: plan → ingest → record → scale, replay, and the table's maintenance."""

from .ingest import SparkKafkaBatchOperator
from .maintain import MaintainTableOperator
from .plan import PlanOffsetRangesOperator
from .record import RecordBatchMetricsOperator
from .replay import ReplayCheckOperator, ReplayFailedRangesOperator
from .scale import ExecutorScalingOperator

__all__ = [
    "PlanOffsetRangesOperator",
    "SparkKafkaBatchOperator",
    "RecordBatchMetricsOperator",
    "ExecutorScalingOperator",
    "ReplayFailedRangesOperator",
    "ReplayCheckOperator",
    "MaintainTableOperator",
]
