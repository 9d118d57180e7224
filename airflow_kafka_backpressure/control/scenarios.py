"""The shipped simulator scenarios (``python -m airflow_kafka_backpressure.simulate --list``) and
the bench's criteria for them (``bench/controller.py``; the unit tests assert the same).

Load is stated against the capacity of runs that start on schedule and end within the interval.
Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .simulate import DEFAULT_SCHEDULER_LATENCY_S, ArrivalProfile, CapacityProfile, Figures, Scenario


def _per_record(arrivals_per_s: float, interval_s: float, fixed_s: float, load: float) -> float:
    """The per-record cost that puts ``arrivals_per_s`` at ``load`` × the capacity of runs that
    start on schedule (the scheduler's latency after they are due) and end within the interval."""
    usable = interval_s - DEFAULT_SCHEDULER_LATENCY_S
    return load * (usable - fixed_s) / (arrivals_per_s * interval_s)


def capacity_drop(
    name: str, description: str, interval_s: float, fixed_s: float, arrivals_per_s: float, capacity_per_s: float,
    *, down_from: int, down_batches: int, factor: float, batches: int,
) -> Scenario:
    """Capacity ``factor`` × ``capacity_per_s`` from batch ``down_from`` for ``down_batches``
    batches, then back; the drain is measured from the first batch that runs at the restored
    capacity, the batches over the interval from the drop."""
    b = interval_s
    drop_end = (down_from + down_batches) * b
    return Scenario(
        name=name,
        description=description,
        batch_interval_s=b,
        duration_s=batches * b,
        arrivals=ArrivalProfile(arrivals_per_s),
        capacity=CapacityProfile(fixed_s, 1 / capacity_per_s, drops=((down_from * b, drop_end, factor),)),
        drain_from_s=drop_end,
        drain_after_change=True,
        overload_from_s=down_from * b,
    )


def issue_drop() -> Scenario:
    return capacity_drop(
        "issue-drop", "issue 8: B=60 s, fixed 15 s, 1,000/s in, capacity 2,000/s dropping to 600/s for 40 batches",
        60.0, 15.0, 1000.0, 2000.0, down_from=20, down_batches=40, factor=0.3, batches=150,
    )


def drop_30() -> Scenario:
    return capacity_drop(
        "drop-30", "B=30 s, fixed 5 s, 2,000/s in at 48% load; capacity drops to 30% for 10 batches",
        30.0, 5.0, 2000.0, 5000.0, down_from=20, down_batches=10, factor=0.3, batches=80,
    )


def noise_90(kind: str = "iid", seed: int = 7) -> Scenario:
    b, fixed = 60.0, 15.0
    return Scenario(
        name="noise-90" if kind == "iid" else f"noise-90-{kind}",
        description=f"B=60 s, fixed 15 s, 1,000/s in at 90% load, ±20% {kind} capacity noise (seed {seed})",
        batch_interval_s=b,
        duration_s=300 * b,
        arrivals=ArrivalProfile(1000.0),
        capacity=CapacityProfile(fixed, _per_record(1000.0, b, fixed, 0.9), noise=0.2, noise_kind=kind, seed=seed),
    )


def fixed_cost(share: float, load: float = 0.9, seed: int = 3) -> Scenario:
    b = 60.0
    fixed = share * b
    return Scenario(
        name=f"fixed-{round(share * 100)}",
        description=(
            f"B=60 s, fixed cost {fixed:g} s ±10% ({share:.0%} of the interval), 1,000/s in at "
            f"{load:.0%} load (seed {seed})"
        ),
        batch_interval_s=b,
        duration_s=150 * b,
        arrivals=ArrivalProfile(1000.0),
        capacity=CapacityProfile(fixed, _per_record(1000.0, b, fixed, load), fixed_noise=0.1, seed=seed),
    )


def fixed_over_interval() -> Scenario:
    b = 30.0
    return Scenario(
        name="fixed-120",
        description="B=30 s, fixed cost 36 s (120% of the interval), 200/s in, 1,000 records/s of work",
        batch_interval_s=b,
        duration_s=100 * b,
        arrivals=ArrivalProfile(200.0),
        capacity=CapacityProfile(36.0, 1 / 1000),
    )


def burst() -> Scenario:
    b = 60.0
    return Scenario(
        name="burst",
        description="B=60 s, fixed 15 s, 1,000/s in at 44% load; a burst of 2,000,000 records at batch 10",
        batch_interval_s=b,
        duration_s=60 * b,
        arrivals=ArrivalProfile(1000.0, bursts=((10 * b + 1, 2_000_000),)),
        capacity=CapacityProfile(15.0, 1 / 3000),
        drain_from_s=10 * b + 1,
    )


def shipped() -> dict[str, Scenario]:
    """Every shipped scenario by name, in the bench's order."""
    scenarios = [
        issue_drop(),
        drop_30(),
        noise_90("iid"),
        noise_90("drift"),
        fixed_cost(0.5),
        fixed_cost(0.9),
        fixed_over_interval(),
        burst(),
    ]
    return {s.name: s for s in scenarios}


# ----- the bench's criteria (issue 8), asserted by the unit tests with the same seeds ------------

#: The issue's thresholds for the cost mode.
MAX_OVER_AFTER_DROP = 2
MAX_DRAIN_FACTOR = 1.05
MAX_OVER_SHARE_UNDER_NOISE = 0.10
MIN_THROUGHPUT_VS_SPARK_UNDER_NOISE = 0.97
MIN_THROUGHPUT_SHARE_WITH_FIXED_COST = 0.90


@dataclass(frozen=True)
class Criterion:
    """One figure the cost mode must reach in a scenario: ``value(spark, cost)`` against a limit."""

    label: str
    limit: float
    upper: bool  # True: value <= limit; False: value >= limit
    value: Callable[[Figures, Figures], float]

    def passed(self, spark: Figures, cost: Figures) -> bool:
        v = self.value(spark, cost)
        return v <= self.limit if self.upper else v >= self.limit

    def describe(self) -> str:
        return f"{'<=' if self.upper else '>='} {self.limit:g}"


def _drop() -> tuple[Criterion, ...]:
    return (
        Criterion("batches over the interval after the drop", MAX_OVER_AFTER_DROP, True, lambda s, c: c.over_after_drop),
        Criterion("drain / physical limit", MAX_DRAIN_FACTOR, True, lambda s, c: c.drain_factor),
    )


def _fixed(scenario: Scenario) -> tuple[Criterion, ...]:
    per_batch = scenario.arrivals.rate * scenario.batch_interval_s
    return (
        Criterion("throughput / physical limit", MIN_THROUGHPUT_SHARE_WITH_FIXED_COST, False, lambda s, c: c.throughput_share),
        Criterion("lag bounded (1 = yes)", 1, False, lambda s, c: float(c.lag_bounded(per_batch))),
    )


def criteria() -> dict[str, tuple[Criterion, ...]]:
    """The issue's criteria by scenario name (the other scenarios are shown, not judged)."""
    noise = (
        Criterion("share of batches over the interval", MAX_OVER_SHARE_UNDER_NOISE, True, lambda s, c: c.over_share),
        Criterion(
            "throughput / Spark mode's", MIN_THROUGHPUT_VS_SPARK_UNDER_NOISE, False, lambda s, c: c.throughput / s.throughput
        ),
    )
    return {
        "issue-drop": _drop(),
        "drop-30": _drop(),
        "noise-90": noise,
        "fixed-50": _fixed(fixed_cost(0.5)),
        "fixed-90": _fixed(fixed_cost(0.9)),
        "burst": (Criterion("drain / physical limit", MAX_DRAIN_FACTOR, True, lambda s, c: c.drain_factor),),
    }


#: What decides which mode did better in a scenario: (label, figure; lower is better).
HEADLINES: dict[str, tuple[str, Callable[[Figures], float]]] = {
    "issue-drop": ("drain / physical limit", lambda f: f.drain_factor or math.inf),
    "drop-30": ("drain / physical limit", lambda f: f.drain_factor or math.inf),
    "noise-90": ("share of batches over the interval", lambda f: f.over_share),
    "noise-90-drift": ("share of batches over the interval", lambda f: f.over_share),
    "fixed-50": ("lag left at the end", lambda f: f.final_lag),
    "fixed-90": ("lag left at the end", lambda f: f.final_lag),
    "fixed-120": ("lag left at the end", lambda f: f.final_lag),
    "burst": ("drain / physical limit", lambda f: f.drain_factor or math.inf),
}
