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

:func:`cost_executor_target` is the ``cost`` mode's rule: the same trigger, but the fitted cost
model decides whether executors can help (they divide the per-record work, not the fixed cost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cost import CostFit
from .scala import scala_round

# The one definition of the scaling defaults: ScalingPolicy, the settings Variable
# (config.ControllerSettings) and the monitoring page all take them from here.
SCALING_UP_RATIO = 0.9  # spark.streaming.dynamicAllocation.scalingUpRatio
SCALING_DOWN_RATIO = 0.3  # spark.streaming.dynamicAllocation.scalingDownRatio
MIN_EXECUTORS = 1  # spark.streaming.dynamicAllocation.minExecutors (Spark: max(1, ...))
MAX_EXECUTORS = 2**31 - 1  # spark.streaming.dynamicAllocation.maxExecutors (Spark: Int.MaxValue)
INITIAL_EXECUTORS = 1  # the executor target before any decision
SCALING_WINDOW_BATCHES = 3  # successful batches averaged per decision
COOLDOWN_BATCHES = 3  # batches after a change during which the target holds (not in Spark)


@dataclass(frozen=True)
class ScalingPolicy:
    scaling_up_ratio: float = SCALING_UP_RATIO
    scaling_down_ratio: float = SCALING_DOWN_RATIO
    min_executors: int = MIN_EXECUTORS
    max_executors: int = MAX_EXECUTORS
    cooldown_batches: int = COOLDOWN_BATCHES

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


def _hold_before_deciding(
    bounded: int, ratio: float | None, policy: ScalingPolicy, batches_since_change: int | None
) -> ScalingDecision | None:
    """The holds both rules share: nothing measured yet, or within the cooldown."""
    if ratio is None:
        return ScalingDecision(bounded, "hold", None, "no successful batch to measure yet")
    if batches_since_change is not None and batches_since_change < policy.cooldown_batches:
        return ScalingDecision(
            bounded,
            "hold",
            ratio,
            f"cooldown: {batches_since_change} of {policy.cooldown_batches} batches since the last change",
        )
    return None


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
    held = _hold_before_deciding(bounded, ratio, policy, batches_since_change)
    if held is not None:
        return held
    assert ratio is not None  # nothing measured yet is a hold
    if ratio >= policy.scaling_up_ratio:
        add = max(scala_round(ratio), 1)
        target = policy.bound(current + add)
        return ScalingDecision(
            target,
            "up" if target > current else "hold",
            ratio,
            f"ratio {ratio:.3f} >= {policy.scaling_up_ratio}: add {add}"
            + (
                ""
                if target == current + add
                else f", bounded to [{policy.min_executors}, {policy.max_executors}]"
            ),
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


def cost_executor_target(
    current: int,
    batches: Sequence[tuple[int, int]],
    batch_interval_ms: int,
    fit: CostFit | None,
    target_ratio: float,
    policy: ScalingPolicy = ScalingPolicy(),
    batches_since_change: int | None = None,
) -> ScalingDecision:
    """The executor target in the ``cost`` mode: Spark's trigger, the cost model's judgement.

    The trigger is Spark's: the average processing time of ``batches`` (``(records,
    processing_ms)`` of recent successful batches) over the interval, against the up and down
    ratios, with the cooldown. The cost model then decides what executors can do, since they
    divide the per-record work and not the fixed cost:

    * up: if the fixed cost is the larger part of a batch, start-up dominates and more executors
      cannot help — hold, and say so. Otherwise add enough executors for the average batch to take
      ``target_ratio`` of the interval (at least one);
    * down: remove one only if the average batch would still fit in ``target_ratio`` with one
      fewer, so scaling down does not undo itself.

    Without a model yet, Spark's rule decides.
    """
    times = [ms for _, ms in batches]
    if fit is None:
        d = executor_target(current, times, batch_interval_ms, policy, batches_since_change)
        return ScalingDecision(d.target, d.action, d.ratio, "no cost model yet, Spark's rule: " + d.reason)
    ratio = processing_ratio(times, batch_interval_ms)
    bounded = policy.bound(current)
    held = _hold_before_deciding(bounded, ratio, policy, batches_since_change)
    if held is not None:
        return held
    assert ratio is not None  # nothing measured yet is a hold
    interval_s = batch_interval_ms / 1000
    e = max(current, 1)
    records = sum(n for n, _ in batches) / len(batches)
    work = fit.per_record_s * records / e  # seconds of per-record work in the average batch now
    split = f"fixed cost {fit.fixed_s:.1f} s + per-record work {work:.1f} s per batch"
    if ratio >= policy.scaling_up_ratio:
        if fit.fixed_s >= work:
            return ScalingDecision(
                bounded,
                "hold",
                ratio,
                f"ratio {ratio:.3f} >= {policy.scaling_up_ratio} but start-up dominates ({split}): more "
                "executors cannot help; raise the interval or use the connect engine",
            )
        room = target_ratio * interval_s - fit.fixed_s
        wanted = math.ceil(e * work / room) if room > 0 else e + max(scala_round(ratio), 1)
        target = policy.bound(max(wanted, current + 1))
        predicted = fit.predict_s(records, target) / interval_s
        return ScalingDecision(
            target,
            "up" if target > current else "hold",
            ratio,
            f"ratio {ratio:.3f} >= {policy.scaling_up_ratio} and per-record work dominates ({split}): "
            f"{target} executor(s) bring the average batch to {predicted:.2f} of the interval"
            + (
                ""
                if target == max(wanted, current + 1)
                else f", bounded to [{policy.min_executors}, {policy.max_executors}]"
            ),
        )
    if ratio <= policy.scaling_down_ratio and current > policy.min_executors:
        fewer = policy.bound(current - 1)
        predicted = fit.predict_s(records, fewer) / interval_s
        if predicted <= target_ratio:
            return ScalingDecision(
                fewer,
                "down",
                ratio,
                f"ratio {ratio:.3f} <= {policy.scaling_down_ratio}: with {fewer} executor(s) the average "
                f"batch takes {predicted:.2f} of the interval ({split})",
            )
        return ScalingDecision(
            bounded,
            "hold",
            ratio,
            f"ratio {ratio:.3f} <= {policy.scaling_down_ratio} but with {fewer} executor(s) the average "
            f"batch would take {predicted:.2f} of the interval, above the target {target_ratio}",
        )
    if ratio <= policy.scaling_down_ratio:
        return ScalingDecision(
            bounded,
            "hold",
            ratio,
            f"ratio {ratio:.3f} <= {policy.scaling_down_ratio}: already at min_executors {policy.min_executors}",
        )
    return ScalingDecision(
        bounded,
        "hold",
        ratio,
        f"ratio {ratio:.3f} between {policy.scaling_down_ratio} and {policy.scaling_up_ratio}",
    )
