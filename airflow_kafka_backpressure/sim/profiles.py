"""What the simulator's scenarios are made of: records arriving (:class:`ArrivalProfile`) and what
a batch costs (:class:`CapacityProfile`: fixed and per-record cost, capacity drops, noise, a cold
start).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

NOISE_KINDS = ("iid", "drift")


@dataclass(frozen=True)
class ArrivalProfile:
    """Records arriving: a rate (records/s) with steps, bursts, and a backlog waiting at t = 0."""

    rate: float
    steps: tuple[tuple[float, float], ...] = ()  # (at_s, new rate)
    bursts: tuple[tuple[float, int], ...] = ()  # (at_s, records arriving at once)
    backlog: int = 0

    def rate_at(self, t: float) -> float:
        rate = self.rate
        for at, r in sorted(self.steps):
            if at <= t:
                rate = r
        return rate

    def arrived(self, t: float) -> int:
        """Records arrived in ``[0, t]`` (the broker's latest offset at ``t``)."""
        total, since, rate = float(self.backlog), 0.0, self.rate
        for at, r in sorted(self.steps):
            if at >= t:
                break
            total += rate * (at - since)
            since, rate = at, r
        total += rate * max(t - since, 0.0)
        total += sum(n for at, n in self.bursts if at <= t)
        return int(math.floor(total + 1e-9))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "steps": [list(s) for s in self.steps],
            "bursts": [list(b) for b in self.bursts],
            "backlog": self.backlog,
        }


@dataclass(frozen=True)
class CapacityProfile:
    """What a batch costs: a fixed cost, a per-record cost, drops of capacity, and noise.

    ``drops`` are ``(from_s, until_s, factor)``: a batch starting in ``[from_s, until_s)`` processes
    records at ``factor`` × the capacity (0.3: 30%). ``noise`` is an amplitude on the per-record
    cost, seeded: ``iid`` draws each batch uniformly in ``±noise``; ``drift`` moves by a uniform step
    of up to ``noise / 4`` per batch, reflected at ``±noise`` (a shared cluster's load drifts).
    ``fixed_noise`` draws each batch's fixed cost uniformly in ``±fixed_noise`` (JVM and container
    start-up on a busy machine). ``cold`` is ``(batches, factor)``: the first ``batches`` batches pay
    ``factor`` × the fixed cost (a cold start: sessions, class loading and caches being filled, and
    on a shared deployment every pipeline started at once contending for the same cores).
    ``startup_share`` of the fixed cost is paid before the batch reads (session start, bounds
    check) and reported as its start-up, as the job's metrics do (0: not reported).
    """

    fixed_s: float
    per_record_s: float
    drops: tuple[tuple[float, float, float], ...] = ()
    noise: float = 0.0
    noise_kind: str = "iid"
    seed: int = 0
    fixed_noise: float = 0.0
    cold: tuple[int, float] = (0, 1.0)
    startup_share: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_record_s <= 0:
            raise ValueError(
                f"capacity: fixed_s >= 0 and per_record_s > 0 required, got {self.fixed_s}, {self.per_record_s}"
            )
        if not (0 <= self.noise < 1 and 0 <= self.fixed_noise < 1):
            raise ValueError(
                f"capacity: noise and fixed_noise must be in [0, 1), got {self.noise}, {self.fixed_noise}"
            )
        if not 0 <= self.startup_share <= 1:
            raise ValueError(f"capacity: startup_share must be in [0, 1], got {self.startup_share}")
        if self.cold[0] < 0 or self.cold[1] < 1:
            raise ValueError(f"capacity: cold must be (batches >= 0, factor >= 1), got {self.cold}")
        if self.noise_kind not in NOISE_KINDS:
            raise ValueError(f"capacity: noise_kind must be one of {NOISE_KINDS}, got {self.noise_kind!r}")
        for a, b, f in self.drops:
            if not (b > a and f > 0):
                raise ValueError(f"capacity: a drop needs from_s < until_s and factor > 0, got {(a, b, f)}")

    def factor_at(self, t: float) -> float:
        factor = 1.0
        for a, b, f in self.drops:
            if a <= t < b:
                factor *= f
        return factor

    def noise_series(self, n: int) -> list[tuple[float, float]]:
        """Per batch: (per-record noise, fixed-cost noise), the same for every mode."""
        rng, fixed_rng = random.Random(self.seed), random.Random(self.seed + 1_000_003)
        fixed = [
            fixed_rng.uniform(-self.fixed_noise, self.fixed_noise) if self.fixed_noise else 0.0
            for _ in range(n)
        ]
        if self.noise_kind == "iid":
            work = [rng.uniform(-self.noise, self.noise) for _ in range(n)]
        else:
            work, x, step = [], 0.0, self.noise / 4
            for _ in range(n):
                x += rng.uniform(-step, step)
                if x > self.noise:
                    x = 2 * self.noise - x
                elif x < -self.noise:
                    x = -2 * self.noise - x
                work.append(x)
        return list(zip(work, fixed))

    def fixed_at(self, batch: int, noise: float = 0.0) -> float:
        """The fixed cost of the ``batch``-th batch (0-based) run."""
        return self.fixed_s * (1 + noise) * (self.cold[1] if batch < self.cold[0] else 1.0)

    def per_record_at(self, t: float, noise: float = 0.0) -> float:
        return self.per_record_s / self.factor_at(t) * (1 + noise)

    def processing_s(
        self, records: int, t: float, noise: tuple[float, float] = (0.0, 0.0), batch: int | None = None
    ) -> float:
        """A batch's time; ``batch`` (0-based) counts it against the cold start, if any."""
        if records <= 0:
            return 0.0
        fixed = self.fixed_at(batch, noise[1]) if batch is not None else self.fixed_s * (1 + noise[1])
        return fixed + records * self.per_record_at(t, noise[0])

    def records_within(self, seconds: float, t: float, noise: tuple[float, float] = (0.0, 0.0)) -> float:
        """The most records a batch starting at ``t`` reads in ``seconds``."""
        return max(seconds - self.fixed_s * (1 + noise[1]), 0.0) / self.per_record_at(t, noise[0])

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_s": self.fixed_s,
            "per_record_s": self.per_record_s,
            "drops": [list(d) for d in self.drops],
            "noise": self.noise,
            "noise_kind": self.noise_kind,
            "seed": self.seed,
            "fixed_noise": self.fixed_noise,
            "cold": list(self.cold),
            "startup_share": self.startup_share,
        }
