"""One pipeline's controller: every control mode (:data:`.modes.REGISTRY`) over its own state, the
active one, and their JSON state.

Every mode is fed every finished batch, whatever the active one, so switching ``mode`` in the
settings takes effect on the next plan with a warm model. The controller names no mode: it asks
the registry and the modes.

The state (the Variable ``kbp.<pipeline>.controller_state``) holds each mode's part under the mode's
name (``spark``: the PID's estimator, rate limit and last batch; ``cost``: the cost model), and
``mode``, ``waiting`` and ``last_plan``. A state written before the modes kept their parts under
their names (the PID's at the top level) loads as it is (:meth:`.modes.ControlMode.legacy_state`);
the next save writes the new layout. NaN, infinite or out-of-range numbers are refused with the
key that holds them.

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .cost_mode import CostParams, PlanInputs
from .modes import COST, REGISTRY, SPARK, ControllerStateError, ControlMode, FinishedBatch, PlanDecision
from .scaling import ScalingDecision, ScalingPolicy

#: The mode names (the registry's keys, live: a mode registered later is one of them).
MODES = REGISTRY.keys()
__all__ = [
    "COST",
    "DEFAULT_MODE",
    "MODES",
    "SPARK",
    "ControllerStateError",
    "Feedback",
    "PipelineController",
    "PlanDecision",
]
#: The bench (bench/controller.py) shows the cost mode winning every shipped scenario.
DEFAULT_MODE = COST


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
    """What one finished batch did, by mode: what each mode's ``observe`` returned (the PID's new
    estimate, the cost model's level-shift event …)."""

    observed: dict[str, Any]


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
    modes: dict[str, ControlMode]
    waiting: Waiting | None = None  # the last run skipped its batch (see wait_for_data)
    #: what the last plan used (mode, rate, regime, reason, budget records): the page's figure
    last_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.mode not in self.modes:
            raise ValueError(f"mode must be one of {', '.join(self.modes)}, got {self.mode!r}")

    @classmethod
    def new(cls, mode: str, settings: Any, batch_interval_ms: int) -> PipelineController:
        """A controller with every registered mode fresh; ``settings``: the parsed settings Variable."""
        return cls(mode, {name: m.create(settings, batch_interval_ms) for name, m in REGISTRY.items()})

    @property
    def active(self) -> ControlMode:
        return self.modes[self.mode]

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
        startup_ms: int | None = None,
    ) -> Feedback:
        """Feed one finished batch to every mode; the active one is told it planned it (the cost
        mode's correction learns only from its own budgets, and is reset otherwise, so a switch to it
        starts the correction from zero)."""
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
            startup_ms,
        )
        params = params or CostParams()
        if window_batches is not None and window_batches != params.window_batches:
            params = replace(params, window_batches=window_batches)
        observed = {
            name: m.observe(batch, params, active=name == self.mode) for name, m in self.modes.items()
        }
        self.waiting = None
        return Feedback(observed)

    def report(self, feedback: Feedback) -> dict[str, Any]:
        """Every mode's figures of the batch ``feedback`` is about (the record task's result)."""
        out: dict[str, Any] = {}
        for name, m in self.modes.items():
            out.update(m.report(feedback.observed.get(name)))
        return out

    def summary(self) -> str:
        return "; ".join(m.summary() for m in self.modes.values())

    def events(self, feedback: Feedback) -> list[str]:
        """What the modes saw in the batch worth telling the user (a level shift of the cost …)."""
        found = (m.event(feedback.observed.get(name)) for name, m in self.modes.items())
        return [e for e in found if e]

    # ----- planning ------------------------------------------------------------------------
    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        """The rate for the planner, from the active mode."""
        return self.active.plan(params, inputs)

    def min_records(self, settings: Any, executors: int) -> int:
        """``min_records_per_batch``, raised to what the active mode asks for (never above the cap
        ``max_records_per_batch``)."""
        n = int(settings.min_records_per_batch)
        derived = self.active.min_records(settings, executors)
        if derived is not None:
            n = min(max(n, derived), settings.max_records_per_batch)
        return n

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
        return self.active.suggest_executors(
            current, batches, batch_interval_ms, params, policy, batches_since_change
        )

    def warning(self, batch_interval_s: float) -> str | None:
        """The first warning any mode has (the cost model's fixed cost, whatever mode plans)."""
        for m in self.modes.values():
            w = m.warning(batch_interval_s)
            if w:
                return w
        return None

    # ----- state ---------------------------------------------------------------------------
    def to_dict(
        self, params: CostParams | None = None, batch_interval_s: float | None = None
    ) -> dict[str, Any]:
        """The state; with ``params`` and the interval the modes also show their fit, targets and
        warnings."""
        d: dict[str, Any] = {name: m.to_dict(params, batch_interval_s) for name, m in self.modes.items()}
        d["mode"] = self.mode
        d["waiting"] = None if self.waiting is None else self.waiting.to_dict()
        d["last_plan"] = self.last_plan
        return d

    @classmethod
    def from_dict(
        cls,
        d: dict[str, Any],
        mode: str,
        settings: Any,
        batch_interval_ms: int,
        *,
        where: str = "controller state",
    ) -> PipelineController:
        """Load a stored state under the current settings (the active ``mode``, each mode's
        parameters: new PID gains re-apply the last batch). A mode without a part in it starts
        fresh."""
        if not isinstance(d, dict):
            raise ControllerStateError(f"{where}: expected a JSON object, got {type(d).__name__}")
        check_finite(d, where)
        modes: dict[str, ControlMode] = {}
        for name, kind in REGISTRY.items():
            if name in d:
                modes[name] = kind.from_state(d[name], settings, batch_interval_ms, f"{where}.{name}")
                continue
            legacy = kind.legacy_state(d)
            modes[name] = (
                kind.create(settings, batch_interval_ms)
                if legacy is None
                else kind.from_state(legacy, settings, batch_interval_ms, where)
            )
        if not any(name in d for name in REGISTRY) and all(
            kind.legacy_state(d) is None for kind in REGISTRY.values()
        ):
            raise ControllerStateError(
                f"{where}: not a controller state (none of the modes' keys: {', '.join(REGISTRY)})"
            )
        last_plan = d.get("last_plan")
        if last_plan is not None and not isinstance(last_plan, dict):
            raise ControllerStateError(
                f"{where}.last_plan = {last_plan!r} is invalid: expected an object or null"
            )
        return cls(mode, modes, Waiting.from_dict(d.get("waiting"), where), last_plan)
