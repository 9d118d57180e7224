"""The ``cost`` control mode: size each batch from a fitted cost model instead of a PID on throughput.

The controller keeps a window of recent batches (records, processing time, executors), fits
``processing = fixed + per-record × records/executors`` (:mod:`.cost`) and sizes the next batch:

* **keep-up**: everything that has arrived fits in a batch predicted to take ``target_ratio`` of
  the interval: read it all (the ratio stays at or below the target, the headroom);
* **drain**: otherwise read more, up to the batch predicted to take ``max_ratio`` of the interval
  divided by ``1 + NOISE_SIGMAS × noise`` (noise: the spread of the one-batch-ahead prediction
  errors — no margin when the times are exact), but never below ``target_ratio``: the margin only
  uses the room between the two (with ``target_ratio = max_ratio`` the batches aim at the target),
  and never below one interval's arrivals where the model predicts they fit within ``max_ratio``
  (headroom is kept when there is no backlog, never by reading less than arrives). With
  ``drain_horizon_s`` = 0 the backlog is read
  as fast as that allows; with a horizon, by the smallest batch (not below the target batch) that
  clears it within the horizon at the current arrival rate, never smaller than the previous batch
  while the drain lasts, so it is really gone within the horizon;
* **capacity**: no batch within the interval keeps up with the arrivals, and the per-record work
  is the larger part: batches stay at the largest one that fits (more executors help, and the
  scaling rule says so);
* **fixed-cost**: no batch within the interval keeps up, and the fixed cost is the larger part:
  shrinking batches cannot help (each batch pays it again), so batches take everything that has
  arrived, run longer than the interval, and keep up. :func:`fixed_cost_warning` says so
  (``fixed cost X s is Y% of the interval: raise the interval or use the connect engine``).

Reaction: a batch whose time is off the model by more than the noise band (at least
``MIN_SHIFT``) is a level shift — capacity dropped or came back. The model keeps its fixed cost,
forgets the older observations and re-anchors the per-record cost on that batch, so the very next
batch is sized for the new capacity, in either direction; the shift is measured (the slower or
faster batch really happened), so a recovery does not overshoot.

While the fixed cost is unknown (every batch had about the same size), a batch that would run above
the target is made ``PROBE`` smaller than usual once: that measures the fixed cost instead of
mistaking it for slow records — the mistake that makes Spark's PID shrink batches for ever. Only
where the arrivals do not fit within ``max_ratio``: where they fit, nothing shrinks for ever, and a
probe only leaves a quarter of a batch behind (under noise the probes came back every few batches,
and the batch after each ran over the interval). Such a pipeline's fixed cost is measured when batch
sizes vary on their own, and :func:`fixed_cost_warning` waits for that.
Growth is bounded by the model's predicted time (a batch planned within ``max_ratio`` of the
interval), not by the sizes seen: after a quiet period a burst is read at once at the largest batch
the model predicts to fit. With more than ``EXTRAPOLATION`` × the largest batch measured available,
the prediction uses a per-record cost never below the last identified one
(:meth:`.cost_model.CostModel.per_record_floor_s`): a fit on batches whose time is all fixed cost cannot tell
the per-record cost and must not plan an unbounded batch. The last identified cost is a line's
(Theil-Sen), or a fit on the known fixed cost whose per-record work is at least ``IDENTIFIED_SHARE``
of a typical batch's time: so it follows a slow drift, and a stale, higher one cannot bound big
batches for ever.

**Correction (a PID on the backlog the budget leaves).** The cost model is the feedforward: it reads
what arrives, and its noise margin keeps drain batches below ``max_ratio``. So the backlog that runs
over the interval leave behind (under noise, or with a model that is slightly off) has no room to
drain in: with ±40% noise at 90% load it grows without bound (``test_simulator``). The correction
removes that steady-state deficit. Its error signal, once per finished
batch, is

    error = (records available at plan − the batch's budget) × per-record cost / executors / interval

the work the budget left behind, as a share of the interval (negative: room the budget left unused).
Its output is a share of the interval added to the drain cap:
``proportional × error + integral × Σerror + derivative × Δerror``, clamped to ``[0, max_ratio − cap]``
(it removes the noise margin where a backlog persists, never plans past ``max_ratio``). The integral
is clamped to ``[0, max_ratio / integral]`` (anti-windup). Headroom is what is kept when there is no
backlog; it is never a reason to let the backlog grow. The gains are the settings' ``proportional``,
``integral`` and ``derivative`` (the same keys as Spark's PID, in these units in this mode).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .correction import Correction
from .cost import DISTINCT_SIZE, CostFit
from .cost_model import DEFAULT_WINDOW_BATCHES

DEFAULT_TARGET_RATIO = 0.75
DEFAULT_MAX_RATIO = 0.99
DEFAULT_DRAIN_HORIZON_S = 0.0
#: The correction's default gains: the settings' defaults for ``proportional``/``integral``/``derivative``
#: (Spark's), which meet the bench's criteria in the cost mode's units too.
DEFAULT_PROPORTIONAL = 1.0
DEFAULT_INTEGRAL = 0.2
DEFAULT_DERIVATIVE = 0.0
#: Drain batches leave this many noise sigmas of headroom below ``max_ratio`` (tuned on the noise
#: scenario of the bench: fewer batches over the interval against the throughput given up).
NOISE_SIGMAS = 1.2
#: With the fixed cost unknown, a batch that must shrink shrinks by at least this much (a probe).
PROBE = 1.25 * DISTINCT_SIZE
#: Beyond this many times the largest batch measured (per executor) a batch is an extrapolation:
#: its predicted time uses a per-record cost never below :meth:`.cost_model.CostModel.per_record_floor_s`.
EXTRAPOLATION = 4.0
#: Arrival rate: the median of the rates between the last plans (robust to one burst).
ARRIVAL_WINDOW_PLANS = 5


def arrival_rate(history: Sequence[tuple[int, int]]) -> float | None:
    """Records/s arriving, from ``(time_ms, total latest offset)`` points of successive plans.

    The median of the rates between consecutive points over the last ``ARRIVAL_WINDOW_PLANS``
    plans, so one burst does not count as a new rate. None with fewer than two points.
    """
    points = sorted(history)[-(ARRIVAL_WINDOW_PLANS + 1) :]
    rates = [max(b[1] - a[1], 0) / ((b[0] - a[0]) / 1000) for a, b in zip(points, points[1:]) if b[0] > a[0]]
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class CostParams:
    target_ratio: float = DEFAULT_TARGET_RATIO
    max_ratio: float = DEFAULT_MAX_RATIO
    drain_horizon_s: float = DEFAULT_DRAIN_HORIZON_S
    window_batches: int = DEFAULT_WINDOW_BATCHES
    proportional: float = DEFAULT_PROPORTIONAL
    integral: float = DEFAULT_INTEGRAL
    derivative: float = DEFAULT_DERIVATIVE

    def __post_init__(self) -> None:
        def bad(name: str, value: object, rule: str) -> ValueError:
            return ValueError(f"cost mode: {name} = {value!r} is invalid: it must be {rule}")

        for name in (
            "target_ratio",
            "max_ratio",
            "drain_horizon_s",
            "proportional",
            "integral",
            "derivative",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, v, "a finite number")
        for name in ("proportional", "integral", "derivative"):
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), ">= 0")
        if not 0 < self.target_ratio <= self.max_ratio:
            raise bad("target_ratio", self.target_ratio, f"in (0, max_ratio = {self.max_ratio}]")
        if not self.max_ratio <= 1:
            raise bad("max_ratio", self.max_ratio, "<= 1")
        if self.drain_horizon_s < 0:
            raise bad("drain_horizon_s", self.drain_horizon_s, ">= 0 (0: drain as fast as possible)")
        if self.window_batches < 2:
            raise bad("window_batches", self.window_batches, ">= 2")


@dataclass(frozen=True)
class BatchBudget:
    """How many records the next batch may read, and why."""

    records: int | None  # None: no model yet; the planner's initial limits apply
    regime: str  # initial | keep-up | drain | capacity | fixed-cost
    reason: str
    predicted_s: float | None = None
    correction: float = 0.0  # the share of the interval the correction added to the drain cap

    def rate(self, batch_interval_s: float) -> float | None:
        """The budget as a rate (records/s over one interval), what the planner takes."""
        return None if self.records is None else self.records / batch_interval_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "regime": self.regime,
            "reason": self.reason,
            "predicted_s": self.predicted_s,
            "correction": self.correction,
        }


@dataclass(frozen=True)
class PlanInputs:
    """What the plan task knows when it sizes a batch.

    :param lag: records available now (latest offsets minus the ledger heads, all partitions).
    :param batch_interval_s: the DAG's schedule interval.
    :param executors: the executors the next batch runs with.
    :param arrivals_per_s: the current arrival rate (None: unknown yet).
    :param previous_budget: the last batch's budget; with ``draining`` (the last plan left a
        backlog behind) and a drain horizon, the budget does not fall below it.
    """

    lag: int
    batch_interval_s: float
    executors: int = 1
    arrivals_per_s: float | None = None
    previous_budget: int | None = None
    draining: bool = False


def plan_budget(
    fit: CostFit | None,
    params: CostParams,
    inputs: PlanInputs,
    correction: Correction | None = None,
    per_record_floor_s: float | None = None,
) -> BatchBudget:
    """The next batch's record budget (a limit: the batch reads at most that many records).

    ``correction`` (the PID's state) raises the drain cap from the feedforward's towards
    ``max_ratio`` while a backlog persists. A batch beyond ``EXTRAPOLATION`` × the largest measured
    (more available than that) is planned with a per-record cost of at least ``per_record_floor_s``
    (:meth:`.cost_model.CostModel.per_record_floor_s`): bounded by a predicted time, not by the sizes seen."""
    if fit is None:
        return BatchBudget(None, "initial", "no batch measured yet: the initial limits apply")
    lag = max(int(inputs.lag), 0)
    interval = inputs.batch_interval_s
    e = max(inputs.executors, 1)
    arrivals_per_s, previous_budget, draining = inputs.arrivals_per_s, inputs.previous_budget, inputs.draining
    extrapolated = ""
    if (
        per_record_floor_s is not None
        and per_record_floor_s > fit.per_record_s
        and lag > EXTRAPOLATION * fit.largest_work_units * e
    ):
        # far beyond the batches measured, on a per-record cost below the last identified one
        fit = replace(fit, per_record_s=per_record_floor_s)
        extrapolated = (
            f"; predicted with the per-record cost last identified ({per_record_floor_s * 1000:.3f} ms): "
            f"{lag} records are far beyond the batches measured"
        )
    margin = 1 + NOISE_SIGMAS * fit.noise
    n_target = fit.records_within(params.target_ratio * interval, e)
    arrivals = (arrivals_per_s or 0.0) * interval  # records arriving per interval
    work_s = arrivals * fit.per_record_s / e  # the per-record work they need per interval
    # the model says one interval's arrivals fit within max_ratio: then the feedforward reads at least
    # them. The noise margin is never a reason to read less than what arrives: a batch below the
    # arrivals leaves a backlog, and the batch that reads it runs over the interval more often
    keeps_up = arrivals > 0 and fit.predict_s(arrivals, e) <= params.max_ratio * interval
    # the longest batch planned: max_ratio less the noise margin, but never below the target — the
    # margin only uses the room between target_ratio and max_ratio (target = max: batches aim at it)
    # — nor below the arrivals where they fit
    ff_cap_s = max(params.max_ratio / margin, params.target_ratio) * interval  # the feedforward's
    if keeps_up:
        ff_cap_s = max(ff_cap_s, fit.predict_s(arrivals, e))
    room = max(params.max_ratio * interval - ff_cap_s, 0.0)
    added = 0.0 if correction is None else min(max(correction.terms(params)["output"] * interval, 0.0), room)
    cap_s = ff_cap_s + added
    n_max = fit.records_within(cap_s, e)

    def done(n: float, regime: str, reason: str) -> BatchBudget:
        if not math.isfinite(n):  # no per-record cost, or the fixed-cost regime: everything there is
            n = max(lag, 1)
        reason += extrapolated
        if added > 0 and regime in ("drain", "capacity"):
            reason += f"; the correction adds {added / interval:.1%} of the interval (a backlog persisted)"
        probe = (1 - PROBE) * fit.typical_work_units * e
        # a probe tells a fixed cost from slow records where batches would not keep up. Where the
        # model says the arrivals fit, a probe would only leave records behind: under noise the
        # fixed cost may never show, and each probe's backlog makes the next batch run over
        if regime != "keep-up" and not keeps_up and _needs_probe(fit, params, min(n, lag), interval, e):
            n = probe
            reason += f"; this batch is {PROBE:.0%} smaller than usual to measure the fixed cost"
        elif fit.method == "proportional" and n < probe:
            # the fixed cost is unknown: if it is what takes the time, smaller batches would not be
            # shorter, only fewer records — shrink one probe step at a time until it is measured
            n = probe
            reason += f"; at most {PROBE:.0%} smaller than usual while the fixed cost is unknown"
        records = max(int(math.floor(n)), 0)
        return BatchBudget(records, regime, reason, fit.predict_s(min(records, lag), e), added / interval)

    if lag <= n_target:
        return done(n_target, "keep-up", f"all {lag} records fit in {params.target_ratio:g} of the interval")
    if ff_cap_s > params.max_ratio * interval / margin:  # the margin would go below the target
        noise_note = f" (held at target_ratio {params.target_ratio:g}: a noise margin of {margin - 1:.0%} would go below it)"
    else:
        noise_note = f" less a noise margin of {margin - 1:.0%}" if margin > 1 else ""
    if params.drain_horizon_s <= 0:
        want = math.inf
    else:
        want = max(n_target, arrivals + (lag - arrivals) / max(params.drain_horizon_s / interval, 1.0))
        if draining and previous_budget is not None:
            want = max(want, float(previous_budget))
    if want <= n_max or lag <= n_max or fit.fixed_s + work_s <= cap_s:
        return done(
            min(want, n_max),
            "drain",
            f"backlog of {lag} records: batches up to {params.max_ratio:g} of the interval{noise_note}",
        )
    # no batch within the interval keeps up with the arrivals: whose share is larger?
    if n_max < 1 or fit.fixed_s > work_s:
        return done(
            math.inf,
            "fixed-cost",
            f"fixed cost {fit.fixed_s:.1f} s leaves too little of the {interval:g} s interval for the "
            f"{work_s:.1f} s of work the arrivals need: batches take everything that arrived and run "
            "longer than the interval, which keeps up",
        )
    return done(
        n_max,
        "capacity",
        f"the arrivals need {work_s:.1f} s of per-record work per {interval:g} s interval besides the "
        f"{fit.fixed_s:.1f} s fixed cost: more executors would help; batches stay within the interval",
    )


def _needs_probe(fit: CostFit, params: CostParams, reads: float, interval: float, executors: int) -> bool:
    """Whether the next batch should be a probe: the fixed cost is unknown (the proportional guess),
    every batch so far had about the usual size, and this one too would, above the target."""
    if fit.method != "proportional":
        return False
    typical = fit.typical_work_units * executors
    usual = (1 - PROBE) * typical < reads < typical * (1 + DISTINCT_SIZE)
    all_usual = fit.largest_work_units * executors < typical * (1 + DISTINCT_SIZE)
    if fit.smallest_work_units is not None:  # a probe still in the window did not tell: no other yet
        all_usual = all_usual and fit.smallest_work_units * executors > typical * (1 - DISTINCT_SIZE)
    return usual and all_usual and fit.predict_s(reads, executors) > params.target_ratio * interval
