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
from dataclasses import dataclass, field, replace
from typing import Any

from .cost import CostModelError
from .cost_mode import CostModel, CostParams, PlanInputs, fixed_cost_warning
from .modes import COST, REGISTRY, SPARK, ControlMode, CostMode, FinishedBatch, PlanDecision, SparkMode
from .pid import PIDRateEstimator, RateController
from .scaling import ScalingDecision, ScalingPolicy

MODES = tuple(REGISTRY)
__all__ = ["COST", "SPARK", "MODES", "PlanDecision", "PipelineController", "ControllerStateError", "Feedback"]
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
            raise ControllerStateError(
                f"{where}.waiting = {d!r} is invalid: expected {{{', '.join(names)}}} (whole numbers >= 0) or null"
            )
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
    #: what the last plan used (mode, rate, regime, reason, budget records): the page's figure
    last_plan: dict[str, Any] | None = None

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
        """Feed one finished batch to every mode (:data:`.modes.REGISTRY`); the active one is told
        it planned it (the cost mode's correction learns only from its own budgets; in the spark mode
        it is reset, so a switch to the cost mode starts it from zero)."""
        batch = FinishedBatch(
            batch_id,
            time_ms,
            records,
            processing_ms,
            scheduling_delay_ms,
            executors,
            left_behind,
            budget,
            batch_interval_s,
        )
        params = params or CostParams()
        if window_batches is not None and window_batches != params.window_batches:
            params = replace(params, window_batches=window_batches)
        out = {
            name: mode.observe(batch, params, active=name == self.mode) for name, mode in self.modes().items()
        }
        self.waiting = None
        return Feedback(out[SPARK], out[COST])

    def modes(self) -> dict[str, ControlMode]:
        """Every mode over this controller's state (each wraps its own state object)."""
        return {SPARK: SparkMode(self.rate), COST: CostMode(self.cost)}

    # ----- planning ------------------------------------------------------------------------
    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        """The rate for the planner, from the active mode."""
        return self.modes()[self.mode].plan(params, inputs)

    def suggest_executors(
        self,
        current: int,
        batches: list[tuple[int, int]],
        batch_interval_ms: int,
        params: CostParams,
        policy: ScalingPolicy,
        batches_since_change: int | None,
    ) -> ScalingDecision:
        """The executor target, by the active mode's rule."""
        return self.modes()[self.mode].suggest_executors(
            current, batches, batch_interval_ms, params, policy, batches_since_change
        )

    def warning(self, batch_interval_s: float) -> str | None:
        return fixed_cost_warning(self.cost.fit(), batch_interval_s)

    # ----- state ---------------------------------------------------------------------------
    def to_dict(
        self, params: CostParams | None = None, batch_interval_s: float | None = None
    ) -> dict[str, Any]:
        """The state; with ``params`` and the interval it also shows the fit, target and warning."""
        d: dict[str, Any] = {}
        for mode in self.modes().values():  # the PID's layout at the top, the cost model under "cost"
            d.update(mode.to_dict())
        cost: dict[str, Any] = d["cost"]
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
        d["last_plan"] = self.last_plan
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
        last_plan = d.get("last_plan")
        if last_plan is not None and not isinstance(last_plan, dict):
            raise ControllerStateError(
                f"{where}.last_plan = {last_plan!r} is invalid: expected an object or null"
            )
        return cls(mode, rate.retuned(estimator), cost, Waiting.from_dict(d.get("waiting"), where), last_plan)
