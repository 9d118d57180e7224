"""The next job's executor count, by Spark Streaming's dynamic-allocation rules.

Spark's streaming ``ExecutorAllocationManager`` averages the processing times of recent successful
batches (whole milliseconds, integer division), divides by the batch interval, and then:

* ratio >= scaling-up ratio (0.9): asks for ``max(round(ratio), 1)`` more executors, Scala rounding,
  within ``[min, max]``;
* ratio <= scaling-down ratio (0.3): removes one executor, never going below ``min``;
* otherwise: keeps the count.

Here the decision sets the executor count of the next bounded job instead of resizing a running
application. A cooldown (no change within ``cooldown_batches`` batches of the last change) keeps
it from flapping, and the target always lies in ``[min, max]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .scala import scala_round

MAX_EXECUTORS_DEFAULT = 2**31 - 1  # Spark's default: Int.MaxValue


@dataclass(frozen=True)
class ScalingPolicy:
    scaling_up_ratio: float = 0.9
    scaling_down_ratio: float = 0.3
    min_executors: int = 1
    max_executors: int = MAX_EXECUTORS_DEFAULT
    cooldown_batches: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, value: object, rule: str) -> ValueError:
            return ValueError(f"ScalingPolicy: {name} = {value!r} is invalid: it must be {rule}")

        if not self.scaling_up_ratio > 0:
            raise bad("scaling_up_ratio", self.scaling_up_ratio, "> 0")
        if not self.scaling_down_ratio > 0:
            raise bad("scaling_down_ratio", self.scaling_down_ratio, "> 0")
        if not self.scaling_up_ratio > self.scaling_down_ratio:
            raise bad(
                "scaling_up_ratio", self.scaling_up_ratio, f"> scaling_down_ratio ({self.scaling_down_ratio})"
            )
        if self.min_executors < 1:
            raise bad("min_executors", self.min_executors, ">= 1")
        if self.max_executors < 1:
            raise bad("max_executors", self.max_executors, ">= 1")
        if self.max_executors < self.min_executors:
            raise bad("max_executors", self.max_executors, f">= min_executors ({self.min_executors})")
        if self.cooldown_batches < 0:
            raise bad("cooldown_batches", self.cooldown_batches, ">= 0")

    def bound(self, n: int) -> int:
        return max(self.min_executors, min(self.max_executors, n))


@dataclass(frozen=True)
class ScalingDecision:
    target: int
    action: str  # "up" | "down" | "hold"
    ratio: float | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target, "action": self.action, "ratio": self.ratio, "reason": self.reason}


def processing_ratio(processing_times_ms: Sequence[int], batch_interval_ms: int) -> float | None:
    """Average processing time over the batch interval, as Spark computes it (None: no batches)."""
    if batch_interval_ms <= 0:
        raise ValueError(f"batch_interval_ms must be > 0, got {batch_interval_ms}")
    if not processing_times_ms:
        return None
    average_ms = sum(int(t) for t in processing_times_ms) // len(processing_times_ms)
    return average_ms / batch_interval_ms


def executor_target(
    current: int,
    processing_times_ms: Sequence[int],
    batch_interval_ms: int,
    policy: ScalingPolicy = ScalingPolicy(),
    batches_since_change: int | None = None,
) -> ScalingDecision:
    """Decide the executor count of the next job.

    :param current: executors the last jobs ran with.
    :param processing_times_ms: processing times of recent successful batches (since the last change).
    :param batches_since_change: batches completed since the count last changed (None: never changed).
    """
    ratio = processing_ratio(processing_times_ms, batch_interval_ms)
    bounded = policy.bound(current)
    if ratio is None:
        return ScalingDecision(bounded, "hold", None, "no successful batch to measure yet")
    if batches_since_change is not None and batches_since_change < policy.cooldown_batches:
        return ScalingDecision(
            bounded,
            "hold",
            ratio,
            f"cooldown: {batches_since_change} of {policy.cooldown_batches} batches since the last change",
        )
    if ratio >= policy.scaling_up_ratio:
        add = max(scala_round(ratio), 1)
        target = policy.bound(current + add)
        return ScalingDecision(
            target,
            "up" if target > current else "hold",
            ratio,
            f"ratio {ratio:.3f} >= {policy.scaling_up_ratio}: add {add}"
            + ("" if target == current + add else f", bounded to [{policy.min_executors}, {policy.max_executors}]"),
        )
    if ratio <= policy.scaling_down_ratio:
        target = policy.bound(current - 1) if current > policy.min_executors else bounded
        return ScalingDecision(
            target,
            "down" if target < current else "hold",
            ratio,
            f"ratio {ratio:.3f} <= {policy.scaling_down_ratio}: remove one"
            + ("" if target < current else f" (already at min_executors {policy.min_executors})"),
        )
    return ScalingDecision(
        bounded,
        "hold",
        ratio,
        f"ratio {ratio:.3f} between {policy.scaling_down_ratio} and {policy.scaling_up_ratio}",
    )
