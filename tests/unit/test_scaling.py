"""Executor target: the rule cases of Spark's streaming ExecutorAllocationManagerSuite, the cooldown,
and Scala rounding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_kafka_backpressure.control.scala import scala_round, to_long
from airflow_kafka_backpressure.control.scaling import (
    ScalingPolicy,
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
    from fractions import Fraction
    import math

    assert scala_round(x) == math.floor(Fraction(x) + Fraction(1, 2))


def test_scala_round_edge_cases():
    assert scala_round(0.49999999999999994) == 0
    assert scala_round(2.5) == 3
    assert scala_round(-2.5) == -2
    assert to_long(3.99) == 3
    assert to_long(-3.99) == -3
