"""The control modes behind one small interface, dispatched from one registry.

A :class:`ControlMode` observes a finished batch, plans the next batch's rate, suggests the
executor count, writes its part of the state Variable and names its own settings keys. ``spark``
(Spark's PID, bit for bit) and ``cost`` (the cost model with its correction) implement it;
:data:`REGISTRY` is what the controller, validation (``config``'s ``mode`` choices) and the docs
read. A mode wraps the state object it works on, so the pipeline controller keeps one state for
each mode and feeds every mode every batch, whatever the active one: switching ``mode`` finds a
warm model. Adding a mode is a class here and a registry line.

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .cost import CostObservation
from .cost_mode import (
    DEFAULT_WINDOW_BATCHES,
    BatchBudget,
    CostModel,
    CostParams,
    PlanInputs,
    correction_error,
    plan_budget,
)
from .pid import RateController
from .scaling import ScalingDecision, ScalingPolicy, cost_executor_target, executor_target

SPARK = "spark"
COST = "cost"


@dataclass(frozen=True)
class FinishedBatch:
    """One finished batch as the record task sees it (Spark's names).

    ``left_behind`` (records between the batch's end and the latest offsets when it was planned)
    and ``budget`` (the records the plan allowed) feed the cost mode's correction."""

    batch_id: int
    time_ms: int
    records: int
    processing_ms: int
    scheduling_delay_ms: int
    executors: int = 1
    left_behind: int | None = None
    budget: float | None = None
    batch_interval_s: float | None = None


@dataclass(frozen=True)
class PlanDecision:
    """What the planner gets: a rate (records/s; <= 0 before the first estimate) and why."""

    mode: str
    rate: float
    budget: BatchBudget | None = None

    @property
    def reason(self) -> str:
        if self.budget is not None:
            return f"{self.budget.regime}: {self.budget.reason}"
        return "Spark PID rate limit" if self.rate > 0 else "no PID estimate yet: the initial limits apply"

    @property
    def regime(self) -> str:
        if self.budget is not None:
            return self.budget.regime
        return "pid" if self.rate > 0 else "initial"

    def to_dict(self) -> dict[str, Any]:
        """What the page shows as the figure that planned: the active mode's rate and regime."""
        return {
            "mode": self.mode,
            "rate": self.rate,
            "regime": self.regime,
            "reason": self.reason,
            "budget_records": None if self.budget is None else self.budget.records,
            "correction": None if self.budget is None else self.budget.correction,
        }


class ControlMode(ABC):
    """One way of sizing batches. ``settings_keys``: the settings Variable's keys it reads."""

    name: ClassVar[str]
    settings_keys: ClassVar[tuple[str, ...]]

    @abstractmethod
    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> Any:
        """Learn from a finished batch (``active``: this mode planned it)."""

    @abstractmethod
    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        """The rate for the next batch."""

    @abstractmethod
    def suggest_executors(
        self,
        current: int,
        batches: Sequence[tuple[int, int]],
        batch_interval_ms: int,
        params: CostParams,
        policy: ScalingPolicy,
        batches_since_change: int | None,
    ) -> ScalingDecision:
        """The executor count for the next jobs, from recent ``(records, processing_ms)``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """This mode's part of the state Variable."""


class SparkMode(ControlMode):
    """Spark Streaming's ``PIDRateEstimator`` and ``RateController``, bit for bit, and Spark's
    dynamic-allocation rule for executors."""

    name = SPARK
    settings_keys = ("proportional", "integral", "derivative", "min_rate", "initial_rate")

    def __init__(self, rate: RateController) -> None:
        self.rate = rate

    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> float | None:
        return self.rate.on_batch_completed(
            batch.time_ms, batch.records, batch.processing_ms, batch.scheduling_delay_ms
        )

    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        return PlanDecision(SPARK, float(self.rate.latest_rate))

    def suggest_executors(self, current, batches, batch_interval_ms, params, policy, batches_since_change):  # type: ignore[no-untyped-def]
        return executor_target(
            current, [ms for _, ms in batches], batch_interval_ms, policy, batches_since_change
        )

    def to_dict(self) -> dict[str, Any]:
        return self.rate.to_dict()


class CostMode(ControlMode):
    """The cost model (feedforward) with its PID correction (:mod:`.cost_mode`); executors only
    where they divide per-record work."""

    name = COST
    settings_keys = (
        "target_ratio",
        "max_ratio",
        "drain_horizon_s",
        "cost_window_batches",
        "proportional",
        "integral",
        "derivative",
    )

    def __init__(self, model: CostModel) -> None:
        self.model = model

    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> str | None:
        obs = CostObservation(
            int(batch.batch_id), int(batch.records), int(batch.processing_ms), int(batch.executors)
        )
        event = self.model.observe(obs, params.window_batches if params else DEFAULT_WINDOW_BATCHES)
        if not active:  # another mode planned the batch: its budget says nothing about this one's
            self.model.correction.reset()
        elif batch.left_behind is not None and batch.batch_interval_s is not None:
            available = int(batch.records) + max(int(batch.left_behind), 0)
            error = correction_error(
                self.model.fit(), available, batch.budget, int(batch.executors), batch.batch_interval_s
            )
            if error is not None:
                self.model.correction.update(error, params)
        return event

    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        budget = plan_budget(
            self.model.fit(), params, inputs, self.model.correction, self.model.per_record_floor_s()
        )
        rate = budget.rate(inputs.batch_interval_s)
        return PlanDecision(COST, -1.0 if rate is None else rate, budget)

    def suggest_executors(self, current, batches, batch_interval_ms, params, policy, batches_since_change):  # type: ignore[no-untyped-def]
        return cost_executor_target(
            current,
            batches,
            batch_interval_ms,
            self.model.fit(),
            params.target_ratio,
            policy,
            batches_since_change,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"cost": self.model.to_dict()}


#: Every mode by name: the settings' ``mode`` choices, dispatch, the docs.
REGISTRY: dict[str, type[ControlMode]] = {SPARK: SparkMode, COST: CostMode}
