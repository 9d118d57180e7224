"""The cost model of a batch: processing time = fixed cost + per-record cost, fitted robustly.

A bounded job pays a fixed cost every batch (JVM and session start, container allocation, the
sink commit) and then a cost per record. Spark's PID measures throughput as records / processing
time, so the fixed cost looks like slow processing; this model keeps the two apart:

    processing_s = fixed_s + per_record_s * records / executors

``per_record_s`` is the cost of one record on one executor; dividing by the executor count lets
batches run with different executor targets share one model (assuming the work spreads evenly;
when it does not, the residuals say so and the model re-anchors, see :class:`.cost_model.CostModel`).

The fit is a Theil–Sen line over a window of recent batches: the slope is the median of the
slopes between every pair of batches of clearly different sizes (weighted by the size difference),
the intercept the median of the residual fixed costs. A few batches can be arbitrarily wrong
without moving it.

* 0 observations: no model.
* 1 observation, or batches of (nearly) identical size: the slope cannot be measured. The last
  measured fixed cost is kept as a prior and the per-record cost is anchored on the median batch;
  without a prior the whole time counts as per-record cost (Spark's view: conservative when
  batches grow, and the next batch of another size identifies the slope).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

#: Batches of sizes closer than this (relative) tell nothing about the per-record cost.
DISTINCT_SIZE = 0.2
#: A fitted slope counts when the size differences explain this many noise spreads of time.
IDENTIFY = 3.0
#: The fallback's per-record cost is measured on the batches at least this share of the largest.
NEAR_LARGEST = 0.5
#: Batches needed before the residuals of a line say how noisy the times are.
MIN_POINTS_FOR_NOISE = 6
#: Robust spread: 1.4826 * MAD estimates the standard deviation of normal residuals.
MAD_TO_SIGMA = 1.4826


class CostModelError(ValueError):
    """A stored cost model is not usable; the message names the field and what to do."""


@dataclass(frozen=True)
class CostObservation:
    """One finished batch as the model sees it.

    ``startup_ms`` is the part of ``processing_ms`` measured before the batch read its first record
    (session or JVM start, the bounds check): fixed cost by construction, whatever the batch's size.
    0: not measured (the whole time is for the fit to split)."""

    batch_id: int
    records: int
    processing_ms: int
    executors: int = 1
    startup_ms: int = 0

    @property
    def processing_s(self) -> float:
        return self.processing_ms / 1000

    @property
    def work_units(self) -> float:
        """Records per executor: what the per-record cost multiplies."""
        return self.records / max(self.executors, 1)

    def net(self) -> CostObservation:
        """The batch without its measured start-up: what the fit splits into fixed and per-record
        cost (at least 1 ms, so a batch whose clock put all of it in the start-up still counts)."""
        if self.startup_ms <= 0:
            return self
        return replace(self, processing_ms=max(self.processing_ms - self.startup_ms, 1), startup_ms=0)

    def to_list(self) -> list[int]:
        return [self.batch_id, self.records, self.processing_ms, self.executors, self.startup_ms]

    @classmethod
    def from_list(cls, row: Sequence[Any], where: str = "observation") -> CostObservation:
        """A stored observation; one stored before ``startup_ms`` existed (four numbers) has none."""
        names = ("batch_id", "records", "processing_ms", "executors", "startup_ms")
        if not isinstance(row, (list, tuple)) or len(row) not in (len(names) - 1, len(names)):
            raise CostModelError(
                f"{where}: expected [{', '.join(names[:-1])}] and optionally {names[-1]}, got {row!r}"
            )
        values = []
        for name, v in zip(names, row):
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or v < 0
                or v != int(v)
            ):
                raise CostModelError(f"{where}: {name} = {v!r} must be a whole number >= 0")
            values.append(int(v))
        return cls(*values)


@dataclass(frozen=True)
class CostFit:
    """A fitted model. ``noise`` is the robust spread of the relative residuals (0 = exact)."""

    fixed_s: float
    per_record_s: float
    noise: float
    observations: int
    method: str  # "theil-sen" | "prior-fixed-cost" | "proportional"
    largest_work_units: float
    typical_work_units: float  # the median batch, per executor
    smallest_work_units: float | None = None  # None: not known (a fit made by hand)
    #: the standard error of ``fixed_s`` where the batches measured it (None: not known). Batches of
    #: nearly one size under noise put the intercept almost anywhere; this says how far.
    fixed_se_s: float | None = None

    def predict_s(self, records: float, executors: int = 1) -> float:
        return self.fixed_s + self.per_record_s * records / max(executors, 1)

    def records_within(self, seconds: float, executors: int = 1) -> float:
        """The most records a batch can hold to finish within ``seconds`` (inf: no per-record cost)."""
        budget = seconds - self.fixed_s
        if budget <= 0:
            return 0.0
        if self.per_record_s <= 0:
            return math.inf
        return budget / self.per_record_s * max(executors, 1)

    def fixed_share(self, records: float, executors: int = 1) -> float:
        """Part of a batch of ``records`` spent on the fixed cost (1.0: all start-up)."""
        total = self.predict_s(records, executors)
        return 1.0 if total <= 0 else self.fixed_s / total

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_s": self.fixed_s,
            "per_record_s": self.per_record_s,
            "noise": self.noise,
            "observations": self.observations,
            "method": self.method,
            "largest_work_units": self.largest_work_units,
            "typical_work_units": self.typical_work_units,
            "smallest_work_units": self.smallest_work_units,
            "fixed_se_s": self.fixed_se_s,
        }


def _weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value at which half the total weight lies on either side (pairs of (value, weight))."""
    pairs = sorted(pairs)
    half = sum(w for _, w in pairs) / 2
    seen = 0.0
    for i, (v, w) in enumerate(pairs):
        seen += w
        if seen > half:
            return v
        if seen == half:  # an exact split: the midpoint, as the plain median does
            return (v + pairs[i + 1][0]) / 2
    return pairs[-1][0]


def _median_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Theil–Sen's slope, each pair weighted by how far apart its sizes are.

    Pairs of nearly equal sizes turn noise into wild slopes; weighting by the size difference
    (Jaeckel's and Sievers' weighted Theil–Sen) lets the widely spaced pairs decide, and pairs closer
    than ``DISTINCT_SIZE`` are left out. None when no pair is usable.
    """
    slopes = []
    for i in range(len(points)):
        xi, yi = points[i]
        for j in range(i + 1, len(points)):
            xj, yj = points[j]
            dx = abs(xj - xi)
            if dx > DISTINCT_SIZE * max(xi, xj):
                slopes.append(((yj - yi) / (xj - xi), dx))
    return _weighted_median(slopes) if slopes else None


def intercept_se(points: Sequence[tuple[float, float]], fixed: float, slope: float) -> float:
    """The standard error of a line's intercept, ``σ·sqrt(1/n + x̄²/Sxx)``, with σ the robust spread
    of the residuals: large when the sizes barely differ. ``points`` hold at least two sizes (a
    Theil–Sen line needs them)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx <= 0:
        raise ValueError("a line's intercept error needs batches of at least two sizes")
    sigma = robust_spread(y - (fixed + slope * x) for x, y in points)
    return sigma * math.sqrt(1 / n + mean_x**2 / sxx)


def robust_spread(values: Iterable[float]) -> float:
    """1.4826 × the median absolute deviation from the median (0 for fewer than 3 values)."""
    vals = list(values)
    if len(vals) < 3:
        return 0.0
    mid = statistics.median(vals)
    return MAD_TO_SIGMA * statistics.median(abs(v - mid) for v in vals)


def fit_cost(
    observations: Sequence[CostObservation],
    prior_fixed_s: float | None = None,
    noise_hint: float | None = None,
    prior_fixed_se_s: float | None = None,
) -> CostFit | None:
    """Fit ``processing = fixed + per_record × records/executors`` to ``observations``.

    Two models compete: the Theil–Sen line, and the fallback that assumes the fixed cost is known
    (``prior_fixed_s``, the last measured one) or, without a prior, zero (the proportional guess,
    which is Spark's view). With ``MIN_POINTS_FOR_NOISE`` batches or more, the line wins when its
    robust residual spread is at most half the fallback's — the sizes explain the times clearly
    better. With fewer batches the residuals cannot show the noise: the line wins when the size
    differences explain ``IDENTIFY`` × the noise known from elsewhere (``noise_hint``, the spread of
    the one-batch-ahead prediction errors; None: unknown, and the fallback stays).
    The returned ``noise`` is the larger of the residual spread and the hint. Empty batches are
    ignored; None when nothing is left. ``fixed_se_s`` is the line's intercept error, or the prior's
    (``prior_fixed_se_s``, from the line that measured it).
    """
    obs = [o for o in observations if o.records > 0 and o.processing_ms > 0]
    if not obs:
        return None
    points = [(o.work_units, o.processing_s) for o in obs]
    xs = [x for x, _ in points]
    median_x = statistics.median(xs)
    median_y = statistics.median(y for _, y in points)

    def made(fixed: float, slope: float, method: str, se: float | None) -> tuple[CostFit, float]:
        fit = CostFit(fixed, slope, 0.0, len(obs), method, max(xs), median_x, min(xs), se)
        spread = robust_spread(y / fit.predict_s(x) - 1 for x, y in points if fit.predict_s(x) > 0)
        return replace(fit, noise=max(spread, noise_hint or 0.0)), spread

    fixed = 0.0 if prior_fixed_s is None else min(max(prior_fixed_s, 0.0), median_y)
    # the median of each batch's own per-record cost: one batch far off (a cold first batch whose
    # JVM and session start-up took most of its time) moves it by one rank at most. The median time
    # over the median size paired two different batches' numbers, and such a batch, the smallest
    # and slowest, moved both medians towards a higher cost (2026-11-29: 11.2 ms/record where every
    # warm batch measured 9.4-10.3, so the cost mode settled at 0.50 of the interval, not 0.6)
    # … over the batches near the largest (at least NEAR_LARGEST of it): where batches grew (a cold
    # start reading more each batch), a small batch's fixed cost per record is far above what the
    # largest measured, and the largest's own figure is already an upper bound on the cost
    near = [(x, y) for x, y in points if x >= NEAR_LARGEST * max(xs)]
    per_record = statistics.median(max(y - fixed, 0.0) / x for x, y in near)
    fallback, fallback_spread = made(
        fixed,
        per_record,
        "proportional" if prior_fixed_s is None else "prior-fixed-cost",
        None if prior_fixed_s is None else prior_fixed_se_s,
    )
    slope = _median_slope(points)
    if slope is None:
        return fallback
    slope = max(slope, 0.0)  # a falling line is noise, or all fixed cost: flat
    line_fixed = min(max(statistics.median(y - slope * x for x, y in points), 0.0), min(y for _, y in points))
    line, line_spread = made(line_fixed, slope, "theil-sen", intercept_se(points, line_fixed, slope))
    if len(points) >= MIN_POINTS_FOR_NOISE:
        return line if line_spread <= fallback_spread / 2 else fallback
    if noise_hint is not None and slope * (max(xs) - min(xs)) >= IDENTIFY * noise_hint * median_y:
        return line
    return fallback
