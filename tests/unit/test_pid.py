"""PIDRateEstimator: every case of Spark's PIDRateEstimatorSuite, plus state round trips."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_kafka_backpressure.control.pid import PIDRateEstimator, RateController


def default_estimator() -> PIDRateEstimator:
    return PIDRateEstimator(20, 1.0, 0.0, 0.0, 10)


@pytest.mark.parametrize(
    "args, name",
    [
        ((0, 1, 2, 3, 10), "batch_interval_ms"),
        ((100, -1, 2, 3, 10), "proportional"),
        ((100, 0, -1, 3, 10), "integral"),
        ((100, 0, 0, -1, 10), "derivative"),
        ((100, 0, 0, 0, 0), "min_rate"),
        ((100, 0, 0, 0, -10), "min_rate"),
    ],
)
def test_estimator_checks_ranges_and_names_the_argument(args, name):
    with pytest.raises(ValueError, match=name):
        PIDRateEstimator(*args)


def test_first_estimate_is_none():
    assert default_estimator().compute(0, 10, 10, 0) is None


def test_second_estimate_is_not_none():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) == 1000  # 1000 elements / s


def test_no_estimate_when_no_time_difference_between_successive_calls():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) is not None
    assert p.compute(10, 10, 10, 0) is None


def test_no_estimate_when_no_records_in_previous_batch():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 0, 10, 0) is None
    assert p.compute(20, -10, 10, 0) is None


def test_no_estimate_when_there_is_no_processing_delay():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 0, 0) is None
    assert p.compute(20, 10, -10, 0) is None


def test_estimate_is_never_less_than_min_rate():
    min_rate = 5.0
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, min_rate)
    # a batch every 20 ms, 1 element, 20 ms of processing, strictly positive scheduling delay
    res = [p.compute(i * 20, 1, 20, 100) for i in range(50)]
    assert res[0] is None
    assert res[1:] == [min_rate] * 49


def test_with_no_accumulated_or_positive_error_follows_the_processing_speed():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    res = [p.compute(i * 20, (i + 1) * 20, 20, 0) for i in range(50)]
    assert res[0] is None
    assert res[1:] == [(x + 1) * 1000.0 for x in range(50)][1:]


def test_with_no_accumulated_but_some_positive_error_follows_the_processing_speed():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    res = [p.compute(i * 20, (50 - i) * 20, 20, 0) for i in range(50)]
    assert res[0] is None
    assert res[1:] == [(50 - x) * 1000.0 for x in range(50)][1:]


@pytest.mark.parametrize("seed", range(20))
def test_with_accumulated_and_positive_error_stays_below_the_processing_speed(seed):
    rng = random.Random(seed)
    p = PIDRateEstimator(20, 1.0, 0.01, 0.0, 10)
    elements = [rng.randrange(1000) for _ in range(50)]
    sched = [rng.randrange(19) for _ in range(50)]
    speeds = [e / 20 * 1000 for e in elements]
    res = [p.compute(i * 20, elements[i], 20, sched[i]) for i in range(50)]
    assert res[0] is None
    for n in range(1, 50):
        if elements[n] == 0:  # Spark's Random.nextInt(1000) can give 0 too: no estimate then
            assert res[n] is None
            continue
        assert res[n] is not None
        if res[n] > 0 and sched[n] > 0:
            assert res[n] < speeds[n]


batches = st.lists(
    st.tuples(
        st.integers(1, 120_000),  # time step (ms)
        st.integers(-5, 1_000_000),  # records
        st.integers(-5, 600_000),  # processing delay
        st.integers(0, 600_000),  # scheduling delay
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(batches=batches, split=st.integers(0, 40), gains=st.tuples(*[st.floats(0, 3)] * 3))
def test_restored_estimator_continues_exactly_as_the_original(batches, split, gains):
    kp, ki, kd = gains
    original = PIDRateEstimator(60_000, kp, ki, kd, 100.0)
    t = 0
    inputs = []
    for step, n, proc, sched in batches:
        t += step
        inputs.append((t, n, proc, sched))
    split = min(split, len(inputs))
    for args in inputs[:split]:
        original.compute(*args)
    restored = PIDRateEstimator.from_dict(json.loads(json.dumps(original.to_dict())))
    assert restored.to_dict() == original.to_dict()
    for args in inputs[split:]:
        assert restored.compute(*args) == original.compute(*args)
        assert restored.state() == original.state()


def test_rate_controller_publishes_the_truncated_rate_like_spark():
    rc = RateController(PIDRateEstimator(1000, 1.0, 0.0, 0.0, 1.0))
    assert rc.latest_rate == -1
    assert rc.on_batch_completed(1000, 10, 3000, 0) is None  # seeds
    assert rc.latest_rate == -1
    rate = rc.on_batch_completed(2000, 10, 3000, 0)
    assert rate == pytest.approx(3.3333, rel=1e-3)
    assert rc.latest_rate == 3  # Double.toLong
    # no estimate: the published limit stays
    assert rc.on_batch_completed(2000, 10, 3000, 0) is None
    assert rc.latest_rate == 3
    again = RateController.from_dict(json.loads(json.dumps(rc.to_dict())))
    assert again.to_dict() == rc.to_dict()


def test_reset_forgets_history():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    p.compute(10, 10, 10, 0)
    p.reset()
    assert p.compute(20, 10, 10, 0) is None


def test_retuned_controller_reapplies_the_last_batch_under_new_gains():
    rc = RateController(PIDRateEstimator(1000, 1.0, 0.2, 0.0, 1.0))
    inputs = [(1000, 500, 2000, 0), (2000, 800, 1500, 300), (3000, 900, 1200, 100)]
    for args in inputs:
        rc.on_batch_completed(*args)

    # the same history, with the new gains in force for the last batch only
    expected = RateController(PIDRateEstimator(1000, 1.0, 0.2, 0.0, 1.0))
    for args in inputs[:-1]:
        expected.on_batch_completed(*args)
    expected = RateController(
        PIDRateEstimator.from_dict(
            {**PIDRateEstimator(1000, 0.5, 0.0, 0.0, 1.0).to_dict(), "state": expected.estimator.state()}
        ),
        expected.rate_limit,
    )
    expected.on_batch_completed(*inputs[-1])

    retuned = rc.retuned(PIDRateEstimator(1000, 0.5, 0.0, 0.0, 1.0))
    assert retuned.estimator.state() == expected.estimator.state()
    assert retuned.rate_limit == expected.rate_limit != rc.rate_limit
    assert retuned.params()["proportional"] == 0.5
    # idempotent: the same gains again change nothing, and JSON keeps everything
    assert retuned.retuned(PIDRateEstimator(1000, 0.5, 0.0, 0.0, 1.0)) is retuned
    assert RateController.from_dict(json.loads(json.dumps(retuned.to_dict()))).to_dict() == retuned.to_dict()


def test_batches_that_change_nothing_do_not_replace_the_last_batch():
    rc = RateController(PIDRateEstimator(1000, 1.0, 0.2, 0.0, 1.0))
    rc.on_batch_completed(1000, 500, 2000, 0)
    rc.on_batch_completed(2000, 800, 1500, 0)
    last = rc.last_batch
    assert rc.on_batch_completed(2000, 800, 1500, 0) is None  # a retried record task: same time
    assert rc.on_batch_completed(3000, 0, 1500, 0) is None  # an empty batch
    assert rc.last_batch == last
