"""One pipeline's controller: the active mode, Spark's PID and the cost model, and their JSON state.

Both models are fed every finished batch, whatever the mode, so switching ``mode`` in the settings
takes effect on the next plan with a warm model:

* ``spark`` — Spark Streaming's ``PIDRateEstimator`` and ``RateController``, bit for bit
  (:mod:`.pid`); the planner gets the PID's published rate limit;
* ``cost`` — the cost-aware mode (:mod:`.cost_mode`); the planner gets the batch budget as a rate.

The state (the Variable ``kbp.<pipeline>.controller_state``) keeps the layout the PID has always
written — ``estimator``, ``rate_limit``, ``last_batch`` at the top — and adds ``mode`` and ``cost``
(observations, fitted fixed and per-record cost, warning, target). A state written before the cost
mode existed loads as a PID state with an empty cost model. NaN, infinite or out-of-range numbers
are refused with the key that holds them.

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .cost import CostModelError, CostObservation
from .cost_mode import (
    DEFAULT_WINDOW_BATCHES,
    BatchBudget,
    CostModel,
    CostParams,
    PlanInputs,
    correction_error,
    fixed_cost_warning,
    plan_budget,
)
from .pid import PIDRateEstimator, RateController

SPARK = "spark"
COST = "cost"
MODES = (SPARK, COST)
#: The bench (bench/controller.py) shows the cost mode winning every shipped scenario.
DEFAULT_MODE = COST


class ControllerStateError(ValueError):
    """The stored controller state cannot be used; the message names the key and the fix."""


def check_finite(value: Any, where: str) -> None:
    """Refuse NaN and infinities anywhere in a JSON value, naming the key path."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ControllerStateError(f"{where} = {value!r} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite(v, f"{where}[{i}]")


@dataclass(frozen=True)
class Feedback:
    """What one finished batch did: the PID's new estimate (None: none, as in Spark) and the cost
    model's level-shift event (None: no shift)."""

    pid_rate: float | None
    cost_event: str | None


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


@dataclass(frozen=True)
class Waiting:
    """A run that skipped its batch: less data than ``min_records_per_batch`` arrived and the last
    batch was planned less than ``max_batch_delay_s`` ago (Structured Streaming's
    ``minOffsetsPerTrigger`` and ``maxTriggerDelay``). Shown on the page as "waiting for data"."""

    available: int  # records available when the run looked
    min_records: int
    last_planned_at_ms: int
    batch_by_ms: int  # from then on, a run plans whatever there is
    checked_at_ms: int

    def reason(self) -> str:
        return (
            f"waiting for data: {self.available} records available, below min_records_per_batch = "
            f"{self.min_records}; a batch runs with whatever there is once max_batch_delay_s has passed "
            f"since the last batch ({(self.batch_by_ms - self.checked_at_ms) / 1000:.0f} s from now)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "min_records": self.min_records,
            "last_planned_at_ms": self.last_planned_at_ms,
            "batch_by_ms": self.batch_by_ms,
            "checked_at_ms": self.checked_at_ms,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Waiting | None:
        if d is None:
            return None
        names = ("available", "min_records", "last_planned_at_ms", "batch_by_ms", "checked_at_ms")
        if not isinstance(d, dict) or not all(
            isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] >= 0 for k in names
        ):
            raise ControllerStateError(f"{where}.waiting = {d!r} is invalid: expected {{{', '.join(names)}}} (whole numbers >= 0) or null")
        return cls(*(int(d[k]) for k in names))


def wait_for_data(
    available: int, min_records: int, max_delay_s: float, last_planned_at_ms: int | None, now_ms: int
) -> Waiting | None:
    """Whether this run skips its batch (a :class:`Waiting`) or plans one (None).

    It skips when fewer than ``min_records`` records are available and the last batch was planned
    less than ``max_delay_s`` ago. No minimum (0), or no batch yet (as Spark's first trigger),
    never skips."""
    if min_records <= 0 or available >= min_records or last_planned_at_ms is None:
        return None
    batch_by = last_planned_at_ms + int(round(max_delay_s * 1000))
    if now_ms >= batch_by:
        return None
    return Waiting(max(int(available), 0), int(min_records), int(last_planned_at_ms), batch_by, int(now_ms))


@dataclass
class PipelineController:
    mode: str
    rate: RateController
    cost: CostModel = field(default_factory=CostModel)
    waiting: Waiting | None = None  # the last run skipped its batch (see wait_for_data)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @classmethod
    def new(cls, mode: str, estimator: PIDRateEstimator) -> PipelineController:
        return cls(mode, RateController(estimator))

    # ----- feedback ------------------------------------------------------------------------
    def on_batch_completed(
        self,
        *,
        batch_id: int,
        time_ms: int,
        records: int,
        processing_ms: int,
        scheduling_delay_ms: int,
        executors: int = 1,
        window_batches: int | None = None,
        params: CostParams | None = None,
        left_behind: int | None = None,
        budget: float | None = None,
        batch_interval_s: float | None = None,
    ) -> Feedback:
        """Feed one finished batch to both models.

        In the cost mode, with the plan's ``left_behind`` (records between the batch's end and the
        latest offsets when it was planned), its ``budget`` (records) and the interval, the
        correction gets its error (:func:`.cost_mode.correction_error`); in the spark mode the
        correction is reset, so a switch to the cost mode starts it from zero."""
        pid_rate = self.rate.on_batch_completed(time_ms, records, processing_ms, scheduling_delay_ms)
        obs = CostObservation(int(batch_id), int(records), int(processing_ms), int(executors))
        window = DEFAULT_WINDOW_BATCHES if window_batches is None else window_batches
        event = self.cost.observe(obs, window)
        self.waiting = None
        if self.mode != COST:
            self.cost.correction.reset()
        elif left_behind is not None and batch_interval_s is not None:
            error = correction_error(
                self.cost.fit(), int(records) + max(int(left_behind), 0), budget, int(executors), batch_interval_s
            )
            if error is not None:
                self.cost.correction.update(error, params or CostParams())
        return Feedback(pid_rate, event)

    # ----- planning ------------------------------------------------------------------------
    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        """The rate for the planner: the PID's published limit, or the cost model's budget."""
        if self.mode == SPARK:
            return PlanDecision(SPARK, float(self.rate.latest_rate))
        budget = plan_budget(
            self.cost.fit(), params, inputs, self.cost.correction, self.cost.per_record_floor_s()
        )
        rate = budget.rate(inputs.batch_interval_s)
        return PlanDecision(COST, -1.0 if rate is None else rate, budget)

    def warning(self, batch_interval_s: float) -> str | None:
        return fixed_cost_warning(self.cost.fit(), batch_interval_s)

    # ----- state ---------------------------------------------------------------------------
    def to_dict(self, params: CostParams | None = None, batch_interval_s: float | None = None) -> dict[str, Any]:
        """The state; with ``params`` and the interval it also shows the fit, target and warning."""
        d = self.rate.to_dict()
        cost: dict[str, Any] = self.cost.to_dict()
        fit = self.cost.fit()
        cost["fit"] = None if fit is None else fit.to_dict()
        if params is not None:
            cost["target_ratio"] = params.target_ratio
            cost["max_ratio"] = params.max_ratio
            cost["correction"]["terms"] = self.cost.correction.terms(params)
        if batch_interval_s is not None:
            cost["warning"] = fixed_cost_warning(fit, batch_interval_s)
        d["mode"] = self.mode
        d["cost"] = cost
        d["waiting"] = None if self.waiting is None else self.waiting.to_dict()
        return d

    @classmethod
    def from_dict(
        cls, d: dict[str, Any], mode: str, estimator: PIDRateEstimator, *, where: str = "controller state"
    ) -> PipelineController:
        """Load a stored state under the current settings (mode and PID parameters).

        New PID gains re-apply the last batch (:meth:`RateController.retuned`).
        """
        if not isinstance(d, dict):
            raise ControllerStateError(f"{where}: expected a JSON object, got {type(d).__name__}")
        check_finite(d, where)
        try:
            rate = RateController.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise ControllerStateError(f"{where}: not a controller state ({type(e).__name__}: {e})") from e
        if not (rate.rate_limit == -1 or rate.rate_limit >= 1):
            raise ControllerStateError(
                f"{where}.rate_limit = {rate.rate_limit} is invalid: it must be -1 (no estimate yet) or >= 1 "
                "record/s (0 would mean 'unlimited')"
            )
        try:
            cost = CostModel.from_dict(d.get("cost") or {}, f"{where}.cost")
        except CostModelError as e:
            raise ControllerStateError(str(e)) from e
        return cls(mode, rate.retuned(estimator), cost, Waiting.from_dict(d.get("waiting"), where))
