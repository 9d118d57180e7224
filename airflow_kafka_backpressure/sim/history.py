"""Tuning from what happened: a simulator scenario rebuilt from a pipeline's recorded batches.

Each plan stores its ranges and the lag it left behind (``plan.lag``), so the broker's latest
offset at planning time is ``sum(until) + lag``: consecutive plans give the arrivals between them.
The finished batches give the cost model (:func:`~.cost.fit_cost` over all of them). Replaying those
arrivals against that capacity under each mode, or another set of gains, answers "what would these
settings have done".

The records come from the ledger (``Ledger.recent_batches``); this module only needs their
attributes, so it stays pure: no Airflow, Spark, Kafka or SQLAlchemy import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_kafka_backpressure.batch.models import BatchPlan

from ..control.cost import CostFit, CostObservation, fit_cost
from .simulate import DEFAULT_SCHEDULER_LATENCY_S, ArrivalProfile, CapacityProfile, Scenario

#: Batch statuses whose metrics measured a real job.
MEASURED = ("succeeded", "replayed")


class RecordedBatch(Protocol):
    """What the replay reads from a ledger row (``ledger.BatchRecord`` has it)."""

    # read-only (properties): the ledger's records are frozen dataclasses
    @property
    def batch_id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def records(self) -> int | None: ...
    @property
    def processing_ms(self) -> int | None: ...
    @property
    def scheduling_delay_ms(self) -> int | None: ...
    @property
    def executors(self) -> int | None: ...
    @property
    def plan(self) -> BatchPlan: ...


class HistoryError(ValueError):
    """The recorded batches cannot be replayed; the message says what is missing."""


@dataclass(frozen=True)
class Recorded:
    """What really happened, for the table next to the replays."""

    batches: int
    measured: int
    over_interval: int
    mean_ratio: float | None
    records: int
    final_lag: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "measured": self.measured,
            "over_interval": self.over_interval,
            "mean_ratio": self.mean_ratio,
            "records": self.records,
            "final_lag": self.final_lag,
        }


def _latest_total(plan: BatchPlan) -> int:
    return sum(r.until_offset for r in plan.ranges) + int(plan.lag or 0)


def scenario_from_history(
    batches: Sequence[RecordedBatch], pipeline: str, *, seed: int = 0
) -> tuple[Scenario, CostFit, Recorded]:
    """The recorded arrivals and the fitted capacity as a scenario, the fit, and what happened.

    Arrivals: the records available at the first plan arrive at once at its start, then the rate
    between each pair of consecutive plans. Capacity: the fitted fixed and per-record cost (at the
    batches' usual executor count), with iid noise of the fit's spread. Scheduler latency: the
    median recorded scheduling delay.
    """
    plans = sorted((b for b in batches if b.plan.lag is not None), key=lambda b: b.plan.planned_at_ms)
    if len(plans) < 2:
        raise HistoryError(
            f"pipeline {pipeline!r}: {len(plans)} recorded plan(s) with their lag; the replay needs at "
            "least 2 to know the arrivals (plans record their lag since the controller release that "
            "added it). Let the pipeline run a few batches and try again."
        )
    measured = [
        b for b in batches if b.status in MEASURED and (b.records or 0) > 0 and (b.processing_ms or 0) > 0
    ]
    observations = [
        CostObservation(
            b.batch_id, int(b.records or 0), int(b.processing_ms or 0), max(int(b.executors or 1), 1)
        )
        for b in sorted(measured, key=lambda b: b.batch_id)
    ]
    fit = fit_cost(observations)
    if fit is None:
        raise HistoryError(
            f"pipeline {pipeline!r}: no succeeded batch with records and a processing time among the "
            f"{len(batches)} read: nothing to fit the cost model to."
        )
    interval_s = plans[-1].plan.batch_interval_ms / 1000
    t0 = plans[0].plan.planned_at_ms
    first = plans[0].plan
    available0 = _latest_total(first) - sum(r.from_offset for r in first.ranges)
    steps = []
    for a, b in zip(plans, plans[1:]):
        dt = (b.plan.planned_at_ms - a.plan.planned_at_ms) / 1000
        if dt > 0:
            rate = max(_latest_total(b.plan) - _latest_total(a.plan), 0) / dt
            steps.append((interval_s + (a.plan.planned_at_ms - t0) / 1000, rate))
    executors = statistics.median(o.executors for o in observations)
    delays = [b.scheduling_delay_ms for b in batches if b.scheduling_delay_ms is not None]
    latency = statistics.median(delays) / 1000 if delays else DEFAULT_SCHEDULER_LATENCY_S
    span = (plans[-1].plan.planned_at_ms - t0) / 1000
    scenario = Scenario(
        name=f"ledger:{pipeline}",
        description=(
            f"pipeline {pipeline!r}: {len(plans)} recorded plans over {span / 60:.1f} min; fitted fixed "
            f"{fit.fixed_s:.1f} s, per-record {fit.per_record_s * 1000:.3f} ms per executor ({fit.method})"
        ),
        batch_interval_s=interval_s,
        duration_s=span + 2 * interval_s,
        arrivals=ArrivalProfile(0.0, tuple(steps), bursts=((interval_s, max(available0, 0)),)),
        capacity=CapacityProfile(
            fit.fixed_s,
            max(fit.per_record_s / max(executors, 1), 1e-12),
            noise=min(fit.noise * math.sqrt(3), 0.9),  # a uniform noise of the fitted spread
            seed=seed,
        ),
        scheduler_latency_s=min(latency, interval_s),
    )
    ratios = [o.processing_s / interval_s for o in observations]
    recorded = Recorded(
        batches=len(plans),
        measured=len(observations),
        over_interval=sum(1 for r in ratios if r > 1),
        mean_ratio=statistics.fmean(ratios) if ratios else None,
        records=sum(o.records for o in observations),
        final_lag=int(plans[-1].plan.lag or 0),
    )
    return scenario, fit, recorded
