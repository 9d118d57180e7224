"""The cost mode's state: recent batches, the priors the fit keeps, and how a finished batch
updates them (a level shift re-anchors the per-record cost). :mod:`.cost_mode` plans a batch from it.

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from .correction import Correction
from .cost import (
    DISTINCT_SIZE,
    MIN_POINTS_FOR_NOISE,
    CostFit,
    CostModelError,
    CostObservation,
    fit_cost,
    robust_spread,
)

DEFAULT_WINDOW_BATCHES = 12
#: A batch off the model by more than max(MIN_SHIFT, SHIFT_SIGMAS × noise) is a level shift;
#: before the noise is known (a few batches), only one off by more than UNKNOWN_NOISE_SHIFT.
MIN_SHIFT = 0.1
SHIFT_SIGMAS = 4.0
UNKNOWN_NOISE_SHIFT = 0.5
#: A fit on the known fixed cost measures the per-record cost when the per-record work is at least
#: this share of a typical batch's time (the last identified per-record cost then follows it).
IDENTIFIED_SHARE = 0.5
#: The start-up the next batch pays: the median of this many last batches' measured start-ups.
STARTUP_BATCHES = 3


def _identifies_per_record(fit: CostFit) -> bool:
    """Whether a fit on a known fixed cost measures the per-record cost: the per-record work is at
    least ``IDENTIFIED_SHARE`` of a typical batch's time (not a trickle, whose time is all fixed)."""
    typical = fit.typical_work_units
    return typical > 0 and fit.per_record_s * typical >= IDENTIFIED_SHARE * fit.predict_s(typical)


@dataclass
class CostModel:
    """The state of the cost mode: recent observations, the fixed-cost prior, the last event.

    Fed by every finished batch whatever the active mode, so switching modes finds it ready.
    """

    observations: list[CostObservation] = field(default_factory=list)
    fixed_prior_s: float | None = None
    last_event: str | None = None
    errors: list[float] = field(default_factory=list)  # recent one-batch-ahead relative errors
    correction: Correction = field(default_factory=Correction)  # the PID on the backlog left behind
    #: the per-record cost last identified (a fitted line, or re-anchored on a level shift): batches
    #: are planned with a per-record cost never below it (see :meth:`fit_for_planning`)
    per_record_prior_s: float | None = None
    #: the standard error of ``fixed_prior_s`` where a line measured it (None: not known)
    fixed_prior_se_s: float | None = None

    def fit(self) -> CostFit | None:
        """The model over the window; its ``noise`` is the spread of the recent one-batch-ahead
        prediction errors (kept across level shifts), which is what a batch's headroom is for.

        The fit splits each batch's time after its measured start-up (:meth:`CostObservation.net`)
        and adds the start-up the next batch is expected to pay (:meth:`startup_s`) to the fixed
        cost: a start-up slowed by a cold or contended machine is never taken for slow records."""
        fit = self._net_fit()
        startup = self.startup_s()
        return fit if fit is None or startup <= 0 else replace(fit, fixed_s=fit.fixed_s + startup)

    def _net_fit(self) -> CostFit | None:
        hint = robust_spread(self.errors) if len(self.errors) >= MIN_POINTS_FOR_NOISE else None
        return fit_cost([o.net() for o in self.observations], self.fixed_prior_s, hint, self.fixed_prior_se_s)

    def startup_s(self) -> float:
        """The start-up the next batch is expected to pay: the median of the last
        ``STARTUP_BATCHES`` batches' (a cold start's long ones stop counting within two batches)."""
        recent = [o.startup_ms for o in self.observations if o.records > 0][-STARTUP_BATCHES:]
        return statistics.median(recent) / 1000 if recent else 0.0

    def per_record_floor_s(self) -> float | None:
        """The per-record cost a batch far beyond the sizes measured is planned with, at least: the
        last identified one, but never above the smallest time per record measured in the window
        after the start-up (the rest of the fixed cost counted as per-record work: the most the
        batches measured now allow); without one, that bound itself. None: no batch.

        A fit on batches too small for the per-record cost to show (a trickle: the fixed cost is
        all of their time) can put it near zero, and then any size would seem to fit the interval;
        with this floor, growth beyond the sizes seen is still bounded by a predicted time."""
        ratios = [
            n.processing_s / n.work_units
            for n in (o.net() for o in self.observations)
            if n.records > 0 and n.processing_ms > 0
        ]
        upper = min(ratios) if ratios else None  # what the batches measured now allow at most
        if self.per_record_prior_s is None or upper is None:
            return upper
        return min(self.per_record_prior_s, upper)  # a prior above it is stale: capacity came back

    def observe(self, obs: CostObservation, window_batches: int = DEFAULT_WINDOW_BATCHES) -> str | None:
        """Add a finished batch; return a description of a level shift, if it was one.

        Empty batches teach nothing and are ignored. A batch seen again (a cleared run) replaces
        its earlier observation.
        """
        if obs.records <= 0 or obs.processing_ms <= 0:
            return None
        self.observations = [o for o in self.observations if o.batch_id != obs.batch_id]
        fit, net = self._net_fit(), obs.net()  # a shift is in the work after the start-up
        if fit is not None and self._can_tell_shift(fit, obs):
            predicted = fit.predict_s(obs.records, obs.executors)
            off = net.processing_s / predicted - 1 if predicted > 0 else math.inf
            noise_known = len(self.errors) >= MIN_POINTS_FOR_NOISE
            band = max(MIN_SHIFT, SHIFT_SIGMAS * fit.noise) if noise_known else UNKNOWN_NOISE_SHIFT
            if math.isfinite(off):
                self.errors = (self.errors + [off])[-2 * window_batches :]
            if abs(off) > band:
                if fit.method != "proportional":  # the proportional guess knows no fixed cost
                    self.fixed_prior_s, self.fixed_prior_se_s = fit.fixed_s, fit.fixed_se_s
                if self.fixed_prior_s is not None and net.processing_s < self.fixed_prior_s:
                    # faster than the fixed cost alone: the fixed cost fell too (a cold start ended),
                    # and taking it as known would leave no per-record cost at all
                    self.fixed_prior_s, self.fixed_prior_se_s = None, None
                self.observations = [obs]
                anchored = self._net_fit()
                if anchored is not None and anchored.method != "proportional":  # the fixed cost is known
                    self.per_record_prior_s = anchored.per_record_s
                kept = "unknown" if self.fixed_prior_s is None else f"{self.fixed_prior_s:.1f} s kept"
                self.last_event = (
                    f"batch {obs.batch_id} took {net.processing_s:.1f} s"
                    f"{' after its start-up' if obs.startup_ms else ''}, {off:+.0%} against the model "
                    f"({predicted:.1f} s): capacity {'dropped' if off > 0 else 'came back'}; per-record "
                    f"cost re-anchored, fixed cost {kept}"
                )
                return self.last_event
        self.observations = (self.observations + [obs])[-window_batches:]
        new = self._net_fit()
        if new is not None and new.method == "theil-sen":
            self.fixed_prior_s, self.fixed_prior_se_s = new.fixed_s, new.fixed_se_s
            self.per_record_prior_s = new.per_record_s
        elif new is not None and new.method == "prior-fixed-cost" and _identifies_per_record(new):
            # the fixed cost is known and the per-record work is most of a batch's time: the window
            # measures the per-record cost. It follows a slow drift, which no line and no level
            # shift catches (a stale, higher prior would bound big batches for ever)
            self.per_record_prior_s = new.per_record_s
        return None

    def _can_tell_shift(self, fit: CostFit, obs: CostObservation) -> bool:
        """Whether a batch off the model means the capacity changed.

        Against a model whose fixed cost is known, yes. Against the proportional first guess (fixed
        cost unknown) only for a batch of the usual size: a batch of another size off the line is
        what identifies the fixed cost, and is kept as such.
        """
        if fit.method != "proportional":
            return True
        usual = statistics.median(o.work_units for o in self.observations if o.records > 0)
        return abs(obs.work_units - usual) <= DISTINCT_SIZE * max(obs.work_units, usual)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observations": [o.to_list() for o in self.observations],
            "fixed_prior_s": self.fixed_prior_s,
            "last_event": self.last_event,
            "errors": list(self.errors),
            "correction": self.correction.to_dict(),
            "per_record_prior_s": self.per_record_prior_s,
            "fixed_prior_se_s": self.fixed_prior_se_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "cost") -> CostModel:
        if not isinstance(d, dict):
            raise CostModelError(f"{where}: expected an object, got {type(d).__name__}")
        rows = d.get("observations", [])
        if not isinstance(rows, list):
            raise CostModelError(f"{where}.observations: expected a list, got {type(rows).__name__}")
        prior = d.get("fixed_prior_s")
        if prior is not None and (
            isinstance(prior, bool)
            or not isinstance(prior, (int, float))
            or not math.isfinite(prior)
            or prior < 0
        ):
            raise CostModelError(f"{where}.fixed_prior_s = {prior!r} must be a finite number >= 0 or null")
        event = d.get("last_event")
        errors = d.get("errors", [])
        if not isinstance(errors, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in errors
        ):
            raise CostModelError(f"{where}.errors = {errors!r} must be a list of finite numbers")
        return cls(
            [CostObservation.from_list(r, f"{where}.observations[{i}]") for i, r in enumerate(rows)],
            None if prior is None else float(prior),
            None if event is None else str(event),
            [float(x) for x in errors],
            Correction.from_dict(d.get("correction"), f"{where}.correction"),
            _optional_non_negative(d.get("per_record_prior_s"), f"{where}.per_record_prior_s"),
            _optional_non_negative(d.get("fixed_prior_se_s"), f"{where}.fixed_prior_se_s"),
        )


def _optional_non_negative(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise CostModelError(f"{where} = {v!r} must be a finite number >= 0 or null")
    return float(v)
