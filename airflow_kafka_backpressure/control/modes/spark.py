"""``spark``: Spark Streaming's ``PIDRateEstimator`` and ``RateController``, bit for bit, and Spark's
dynamic-allocation rule for executors.

Its state (the Variable's ``spark`` key): the estimator, the published rate limit and the last batch
that moved the estimator (:class:`~..pid.RateController`). New gains re-apply that batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..cost_mode import CostParams, PlanInputs
from ..pid import RateController
from ..scaling import ScalingDecision, ScalingPolicy, executor_target
from .base import ControllerStateError, ControlMode, FinishedBatch, PlanDecision, fmt


class SparkMode(ControlMode):
    name: ClassVar[str] = "spark"
    settings_keys: ClassVar[tuple[str, ...]] = (
        "proportional",
        "integral",
        "derivative",
        "min_rate",
        "initial_rate",
    )

    def __init__(self, rate: RateController) -> None:
        self.rate = rate
        self._rate_before = rate.latest_rate

    @classmethod
    def create(cls, settings: Any, batch_interval_ms: int) -> SparkMode:
        return cls(RateController(settings.estimator(batch_interval_ms)))

    @classmethod
    def from_state(cls, state: Any, settings: Any, batch_interval_ms: int, where: str) -> SparkMode:
        if not isinstance(state, dict):
            raise ControllerStateError(f"{where}: not a controller state (expected an object, got {state!r})")
        try:
            rate = RateController.from_dict(state)
        except (KeyError, TypeError, ValueError) as e:
            raise ControllerStateError(f"{where}: not a controller state ({type(e).__name__}: {e})") from e
        if not (rate.rate_limit == -1 or rate.rate_limit >= 1):
            raise ControllerStateError(
                f"{where}.rate_limit = {rate.rate_limit} is invalid: it must be -1 (no estimate yet) or >= 1 "
                "record/s (0 would mean 'unlimited')"
            )
        return cls(rate.retuned(settings.estimator(batch_interval_ms)))

    @classmethod
    def legacy_state(cls, state: dict[str, Any]) -> Any:
        """Before the ``spark`` key the PID's state was the state's top level."""
        return state if "estimator" in state or "rate_limit" in state else None

    def to_dict(
        self, params: CostParams | None = None, batch_interval_s: float | None = None
    ) -> dict[str, Any]:
        return self.rate.to_dict()

    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> float | None:
        self._rate_before = self.rate.latest_rate
        return self.rate.on_batch_completed(
            batch.time_ms, batch.records, batch.processing_ms, batch.scheduling_delay_ms
        )

    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        return PlanDecision(self.name, float(self.rate.latest_rate))

    def suggest_executors(
        self,
        current: int,
        batches: Sequence[tuple[int, int]],
        batch_interval_ms: int,
        params: CostParams,
        policy: ScalingPolicy,
        batches_since_change: int | None,
    ) -> ScalingDecision:
        return executor_target(
            current, [ms for _, ms in batches], batch_interval_ms, policy, batches_since_change
        )

    def report(self, observed: Any) -> dict[str, Any]:
        return {
            "estimated_rate": observed,
            "rate_limit_before": self._rate_before,
            "rate_limit": self.rate.latest_rate,
        }

    def summary(self) -> str:
        return f"PID rate limit {self.rate.latest_rate} records/s"

    @classmethod
    def page_cards(cls, state: Any, last_plan: Any) -> list[dict[str, str]]:
        rl = state.get("rate_limit") if isinstance(state, dict) else None
        value = fmt(rl) if not isinstance(rl, (int, float)) or rl >= 0 else "none"
        return [
            {
                "title": "Rate limit now (spark mode)",
                "value": value if value in ("none", "\u2013") else f"{value} /s",
                "detail": "controller_state.spark.rate_limit",
            }
        ]
