"""Executor target: the rule cases of Spark's streaming ExecutorAllocationManagerSuite, the cooldown,
and Scala rounding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_kafka_backpressure.control.cost import CostFit
from airflow_kafka_backpressure.control.scala import scala_round, to_long
from airflow_kafka_backpressure.control.scaling import (
    ScalingPolicy,
    cost_executor_target,
    executor_target,
    processing_ratio,
)

INTERVAL = 1000  # the suite's batch duration


@pytest.mark.parametrize(
    "proc_ms, expected",
    [
        (INTERVAL, 3),  # ratio 1: one more executor
        (INTERVAL * 2, 4),  # ratio 2: two more
        (INTERVAL * 0.9 + 1, 3),  # just above the up ratio: one more
        (INTERVAL * 0.9 - 1, 2),  # just below the up ratio: no change
        (INTERVAL * 0.3 + 1, 2),  # just above the down ratio: no change
        (INTERVAL * 0.3 - 1, 1),  # just below the down ratio: one fewer
    ],
)
def test_basic_functionality(proc_ms, expected):
    decision = executor_target(2, [int(proc_ms)], INTERVAL)
    assert decision.target == expected


# requestExecutors policy: (current, new executors asked for, expected total), per min/max
@pytest.mark.parametrize(
    "policy, cases",
    [
        (ScalingPolicy(min_executors=1), [(0, 1, 1), (1, 1, 2), (2, 2, 4)]),
        (ScalingPolicy(min_executors=2), [(0, 1, 2), (0, 3, 3), (1, 1, 2), (1, 2, 3), (2, 1, 3), (2, 2, 4)]),
        (ScalingPolicy(max_executors=2), [(0, 1, 1), (0, 3, 2), (1, 2, 2), (2, 1, 2), (2, 2, 2)]),
    ],
)
def test_request_executors_policy(policy, cases):
    for current, new, expected in cases:
        # a ratio that rounds to exactly `new` executors to add
        decision = executor_target(current, [new * INTERVAL], INTERVAL, policy)
        assert decision.target == expected, (current, new)


@pytest.mark.parametrize(
    "min_executors, current, expected",
    [
        (1, 0, 1),  # nothing to remove (Spark: no executors, nothing killed); bounded to min
        (1, 1, 1),  # at the minimum: nothing removed
        (1, 2, 1),  # one removed
        (2, 2, 2),  # at the minimum of 2: nothing removed
        (2, 3, 2),  # one removed
    ],
)
def test_kill_executor_policy(min_executors, current, expected):
    decision = executor_target(current, [100], INTERVAL, ScalingPolicy(min_executors=min_executors))
    assert decision.target == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_executors=0),
        dict(min_executors=-1),
        dict(max_executors=0),
        dict(max_executors=-1),
        dict(min_executors=4, max_executors=3),
        dict(scaling_up_ratio=-0.1),
        dict(scaling_up_ratio=0),
        dict(scaling_down_ratio=-0.1),
        dict(scaling_down_ratio=0),
        dict(scaling_up_ratio=0.5, scaling_down_ratio=0.5),
        dict(scaling_up_ratio=0.3, scaling_down_ratio=0.5),
        dict(cooldown_batches=-1),
    ],
)
def test_parameter_validation_rejects(kwargs):
    with pytest.raises(ValueError):
        ScalingPolicy(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_executors=1),
        dict(min_executors=3),
        dict(max_executors=3),
        dict(max_executors=1),
        dict(min_executors=3, max_executors=3),
        dict(scaling_up_ratio=1.1),
        dict(scaling_down_ratio=0.1),
        dict(scaling_up_ratio=1.1, scaling_down_ratio=0.1),
    ],
)
def test_parameter_validation_accepts(kwargs):
    ScalingPolicy(**kwargs)


def test_average_uses_whole_milliseconds_like_spark():
    # (899 + 900) // 2 = 899 -> 0.899 < 0.9: hold, although the true mean 899.5 would also hold;
    # (900 + 901) // 2 = 900 -> 0.9: up
    assert processing_ratio([899, 900], INTERVAL) == 0.899
    assert executor_target(2, [900, 901], INTERVAL).target == 3
    assert processing_ratio([], INTERVAL) is None


def test_ratio_rounds_half_up_like_scala():
    assert executor_target(1, [2500], INTERVAL).target == 1 + 3  # round(2.5) = 3 in Scala, 2 in Python
    assert executor_target(1, [1499], INTERVAL).target == 2


def test_no_batches_holds():
    d = executor_target(3, [], INTERVAL)
    assert (d.target, d.action) == (3, "hold")


def test_cooldown_holds_until_enough_batches_passed():
    policy = ScalingPolicy(cooldown_batches=3)
    assert executor_target(2, [5000], INTERVAL, policy, batches_since_change=2).target == 2
    assert executor_target(2, [5000], INTERVAL, policy, batches_since_change=3).target == 7
    assert executor_target(2, [5000], INTERVAL, policy, batches_since_change=None).target == 7


def test_target_is_bounded_even_when_holding():
    policy = ScalingPolicy(min_executors=2, max_executors=4)
    assert executor_target(9, [500], INTERVAL, policy).target == 4
    assert executor_target(1, [500], INTERVAL, policy).target == 2


@given(st.floats(-1e12, 1e12, allow_nan=False))
def test_scala_round_matches_java_math_round(x):
    # Java: Math.round(x) == floor(x + 1/2) computed exactly
    import math
    from fractions import Fraction

    assert scala_round(x) == math.floor(Fraction(x) + Fraction(1, 2))


def test_scala_round_edge_cases():
    assert scala_round(0.49999999999999994) == 0
    assert scala_round(2.5) == 3
    assert scala_round(-2.5) == -2
    assert to_long(3.99) == 3
    assert to_long(-3.99) == -3


# ----- the cost mode's rule -------------------------------------------------------------------

MINUTE = 60_000


def fit(fixed: float, per_record: float) -> CostFit:
    return CostFit(fixed, per_record, 0.0, 12, "theil-sen", 1e6, 1e5)


def test_cost_rule_adds_executors_when_per_record_work_dominates():
    # 15 s start-up + 90,000 records at 0.5 ms on 1 executor = 60 s: ratio 1.0
    d = cost_executor_target(1, [(90_000, 60_000)], MINUTE, fit(15.0, 0.0005), 0.75)
    assert d.action == "up" and "per-record work dominates" in d.reason
    # 45 s of work on n executors must fit in 0.75 × 60 − 15 = 30 s: 2 executors
    assert d.target == 2
    assert "bring the average batch to 0.62 of the interval" in d.reason


def test_cost_rule_holds_when_start_up_dominates():
    d = cost_executor_target(2, [(10_000, 58_000)], MINUTE, fit(54.0, 0.0008), 0.75)
    assert (d.action, d.target) == ("hold", 2)
    assert "start-up dominates" in d.reason and "connect engine" in d.reason
    # Spark's rule would have added executors for the same batch
    assert executor_target(2, [58_000], MINUTE).target > 2


def test_cost_rule_removes_one_only_if_the_rest_still_fit_the_target():
    light = fit(5.0, 0.0005)
    down = cost_executor_target(3, [(20_000, 10_000)], MINUTE, light, 0.75)
    assert (down.action, down.target) == ("down", 2)
    # measured ratio 0.28 triggers Spark's down rule, but with 2 executors the average batch would
    # take 40 s + 60,000 × 0.5 ms / 2 = 55 s: far above a 0.5 target, so the count holds
    heavy = fit(40.0, 0.0005)
    hold = cost_executor_target(3, [(60_000, 17_000)], MINUTE, heavy, 0.5)
    assert hold.action == "hold" and "above the target" in hold.reason


def test_cost_rule_keeps_sparks_trigger_cooldown_and_bounds():
    f = fit(15.0, 0.0005)
    assert cost_executor_target(1, [], MINUTE, f, 0.75).reason == "no successful batch to measure yet"
    cooling = cost_executor_target(
        1, [(90_000, 60_000)], MINUTE, f, 0.75, ScalingPolicy(cooldown_batches=3), batches_since_change=1
    )
    assert cooling.action == "hold" and "cooldown" in cooling.reason
    bounded = cost_executor_target(1, [(900_000, 500_000)], MINUTE, f, 0.75, ScalingPolicy(max_executors=3))
    assert bounded.target == 3 and "bounded" in bounded.reason
    assert cost_executor_target(2, [(1000, 30_000)], MINUTE, f, 0.75).action == "hold"  # between the ratios


def test_cost_rule_without_a_model_falls_back_to_sparks():
    d = cost_executor_target(2, [(1000, 60_000)], MINUTE, None, 0.75)
    assert d.target == executor_target(2, [60_000], MINUTE).target
    assert d.reason.startswith("no cost model yet, Spark's rule")


def test_one_definition_of_the_scaling_defaults():
    from airflow_kafka_backpressure.config.settings import ControllerSettings
    from airflow_kafka_backpressure.control import scaling

    s = ControllerSettings()
    assert s.scaling_policy() == ScalingPolicy()
    assert (s.scaling_up_ratio, s.scaling_down_ratio) == (
        scaling.SCALING_UP_RATIO,
        scaling.SCALING_DOWN_RATIO,
    )
    assert (s.min_executors, s.max_executors, s.initial_executors) == (
        scaling.MIN_EXECUTORS,
        scaling.MAX_EXECUTORS,
        scaling.INITIAL_EXECUTORS,
    )
    assert (s.scaling_window_batches, s.cooldown_batches) == (
        scaling.SCALING_WINDOW_BATCHES,
        scaling.COOLDOWN_BATCHES,
    )
