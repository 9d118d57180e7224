"""The interface every control mode implements, and what it exchanges with the controller.

Spark's ``RateEstimator`` is the model: one small class per way of sizing batches, one factory, each
mode owning its state. A :class:`ControlMode` is made fresh (:meth:`ControlMode.create`) or from its
part of the stored state (:meth:`ControlMode.from_state`), observes every finished batch, plans the
next batch's rate when it is the active mode, suggests the executor count, and answers the questions
the operators would otherwise ask by the mode's name (the smallest batch worth running, a warning,
its figures in the record task's result).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..cost_mode import BatchBudget, CostParams, PlanInputs
from ..scaling import ScalingDecision, ScalingPolicy


class ControllerStateError(ValueError):
    """The stored controller state cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class FinishedBatch:
    """One finished batch as the record task sees it (Spark's names).

    ``left_behind`` (records between the batch's end and the latest offsets when it was planned)
    and ``budget`` (the records the plan allowed) feed the cost mode's correction; ``startup_ms``
    (launch to the first record read) is fixed cost the cost mode need not fit."""

    batch_id: int
    time_ms: int
    records: int
    processing_ms: int
    scheduling_delay_ms: int
    executors: int = 1
    left_behind: int | None = None
    budget: float | None = None
    batch_interval_s: float | None = None
    startup_ms: int | None = None  # of processing_ms, before the first record was read


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
    """One way of sizing batches.

    ``settings``, wherever a method takes it, is the pipeline's parsed settings Variable
    (``config.ControllerSettings``): a mode reads the keys it names in ``settings_keys``."""

    name: ClassVar[str]
    #: the settings Variable's keys this mode reads (the docs list them per mode)
    settings_keys: ClassVar[tuple[str, ...]]

    # ----- the factory ------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def create(cls, settings: Any, batch_interval_ms: int) -> ControlMode:
        """This mode with no batch seen."""

    @classmethod
    @abstractmethod
    def from_state(cls, state: Any, settings: Any, batch_interval_ms: int, where: str) -> ControlMode:
        """This mode from its part of the stored state (under the current settings); raises
        :class:`ControllerStateError` naming the key under ``where`` that cannot be used."""

    @classmethod
    def legacy_state(cls, state: dict[str, Any]) -> Any:
        """This mode's part of a state written before the modes kept their state under their names
        (None: the mode starts fresh)."""
        return None

    @abstractmethod
    def to_dict(
        self, params: CostParams | None = None, batch_interval_s: float | None = None
    ) -> dict[str, Any]:
        """This mode's part of the state Variable (``params`` and the interval: what it shows besides)."""

    # ----- the loop ---------------------------------------------------------------------------
    @abstractmethod
    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> Any:
        """Learn from a finished batch (``active``: this mode planned it); what it learnt goes to
        :meth:`report`."""

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

    # ----- what the operators ask -------------------------------------------------------------
    def min_records(self, settings: Any, executors: int) -> int | None:
        """The smallest batch worth running while this mode plans (None: no opinion)."""
        return None

    def warning(self, batch_interval_s: float) -> str | None:
        """Something the user should know about the pipeline (None: nothing)."""
        return None

    def report(self, observed: Any) -> dict[str, Any]:
        """This mode's figures in the record task's result, ``observed`` being what :meth:`observe`
        returned for the batch."""
        return {}

    def summary(self) -> str:
        """One phrase for the record task's log line."""
        return self.name

    def event(self, observed: Any) -> str | None:
        """What :meth:`observe` saw worth telling the user (a level shift, say), or None."""
        return None

    # ----- what the monitoring page shows -----------------------------------------------------
    @classmethod
    def page_cards(cls, state: Any, last_plan: Any) -> list[dict[str, str]]:
        """The monitoring page's cards while this mode plans (``title``, ``value``, ``detail``), from
        its part of the stored state (a JSON object, or None) and the last plan
        (:meth:`PlanDecision.to_dict` with the batch id, or None)."""
        return []


def fmt(value: Any, digits: int = 0) -> str:
    """A number as the page writes it (thousands separated); a dash for no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "\u2013"
    return f"{value:,.{digits}f}"
