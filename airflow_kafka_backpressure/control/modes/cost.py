"""``cost``: the cost model (feedforward: fixed and per-record cost fitted on recent batches) with its
PID correction (:mod:`..cost_mode`); executors only where they divide per-record work.

Its state (the Variable's ``cost`` key): the observations, the fixed-cost prior, the correction and,
for the page, the fit, the targets and the fixed-cost warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..correction import correction_error
from ..cost import CostModelError, CostObservation
from ..cost_mode import CostParams, PlanInputs, plan_budget
from ..cost_model import DEFAULT_WINDOW_BATCHES, CostModel
from ..fixed_cost import fixed_cost_warning, records_for_fixed_share
from ..scaling import ScalingDecision, ScalingPolicy, cost_executor_target
from .base import ControllerStateError, ControlMode, FinishedBatch, PlanDecision, fmt


class CostMode(ControlMode):
    name: ClassVar[str] = "cost"
    settings_keys: ClassVar[tuple[str, ...]] = (
        "target_ratio",
        "max_ratio",
        "drain_horizon_s",
        "cost_window_batches",
        "min_batch_fixed_share",
        "proportional",
        "integral",
        "derivative",
    )

    def __init__(self, model: CostModel) -> None:
        self.model = model

    @classmethod
    def create(cls, settings: Any, batch_interval_ms: int) -> CostMode:
        return cls(CostModel())

    @classmethod
    def from_state(cls, state: Any, settings: Any, batch_interval_ms: int, where: str) -> CostMode:
        try:
            return cls(CostModel.from_dict(state or {}, where))
        except CostModelError as e:
            raise ControllerStateError(str(e)) from e

    @classmethod
    def legacy_state(cls, state: dict[str, Any]) -> Any:
        return state.get(cls.name)  # it always lived under "cost"

    def to_dict(
        self, params: CostParams | None = None, batch_interval_s: float | None = None
    ) -> dict[str, Any]:
        d = self.model.to_dict()
        fit = self.model.fit()
        d["fit"] = None if fit is None else fit.to_dict()
        if params is not None:
            d["target_ratio"] = params.target_ratio
            d["max_ratio"] = params.max_ratio
            d["correction"]["terms"] = self.model.correction.terms(params)
        if batch_interval_s is not None:
            d["warning"] = fixed_cost_warning(fit, batch_interval_s)
        return d

    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> str | None:
        obs = CostObservation(
            int(batch.batch_id),
            int(batch.records),
            int(batch.processing_ms),
            int(batch.executors),
            min(max(int(batch.startup_ms or 0), 0), int(batch.processing_ms)),
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
        return PlanDecision(self.name, -1.0 if rate is None else rate, budget)

    def suggest_executors(
        self,
        current: int,
        batches: Sequence[tuple[int, int]],
        batch_interval_ms: int,
        params: CostParams,
        policy: ScalingPolicy,
        batches_since_change: int | None,
    ) -> ScalingDecision:
        return cost_executor_target(
            current,
            batches,
            batch_interval_ms,
            self.model.fit(),
            params.target_ratio,
            policy,
            batches_since_change,
        )

    def min_records(self, settings: Any, executors: int) -> int | None:
        """With ``min_batch_fixed_share``: the batch whose fitted fixed cost is at most that share
        of its time (0 before the model is fitted)."""
        if settings.min_batch_fixed_share <= 0:
            return None
        return records_for_fixed_share(self.model.fit(), settings.min_batch_fixed_share, executors)

    def warning(self, batch_interval_s: float) -> str | None:
        return fixed_cost_warning(self.model.fit(), batch_interval_s)

    def report(self, observed: Any) -> dict[str, Any]:
        fit = self.model.fit()
        return {"cost": None if fit is None else fit.to_dict(), "cost_event": observed}

    def event(self, observed: Any) -> str | None:
        return observed if isinstance(observed, str) else None

    @classmethod
    def page_cards(cls, state: Any, last_plan: Any) -> list[dict[str, str]]:
        """What planned (the budget as a rate, its regime) and the correction's terms: the cost mode
        plans with its budget, not with the PID's rate limit."""
        cards = []
        if isinstance(last_plan, dict) and last_plan.get("mode") == cls.name:
            rate = last_plan.get("rate")
            records = last_plan.get("budget_records")
            cards.append(
                {
                    "title": "Batch budget (cost mode)",
                    "value": f"{fmt(rate)} /s"
                    if isinstance(rate, (int, float)) and rate > 0
                    else "initial limits",
                    "detail": f"regime {last_plan.get('regime')}"
                    + (f", {fmt(records)} records" if isinstance(records, (int, float)) else "")
                    + f", batch #{last_plan.get('batch_id')}: {last_plan.get('reason') or ''}",
                }
            )
        else:
            cards.append(
                {
                    "title": "Batch budget (cost mode)",
                    "value": "\u2013",
                    "detail": "no batch planned in this mode yet",
                }
            )
        terms = (state.get("correction") or {}).get("terms") if isinstance(state, dict) else None
        if isinstance(terms, dict) and all(
            isinstance(terms.get(k), (int, float))
            for k in ("output", "error", "proportional", "integral", "derivative")
        ):
            cards.append(
                {
                    "title": "Correction (PID)",
                    "value": f"{fmt(100 * terms['output'], 1)}% of the interval",
                    "detail": f"error {fmt(100 * terms['error'], 1)}%: P {fmt(100 * terms['proportional'], 1)} + "
                    f"I {fmt(100 * terms['integral'], 1)} + D {fmt(100 * terms['derivative'], 1)} "
                    "(points of the interval added to the drain cap)",
                }
            )
        return cards

    def summary(self) -> str:
        fit = self.model.fit()
        if fit is None:
            return "cost model not fitted yet"
        return f"cost model fixed {fit.fixed_s:.1f} s + {fit.per_record_s * 1000:.3f} ms/record/executor ({fit.method})"
