"""The cost model: processing = fixed + per-record × records/executors, fitted robustly, with
sensible answers for 0, 1 or identical-size observations."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from airflow_kafka_backpressure.control.cost import (
    CostModelError,
    CostObservation,
    fit_cost,
    robust_spread,
)


def obs(records: int, seconds: float, executors: int = 1, batch_id: int = 0) -> CostObservation:
    return CostObservation(batch_id, records, int(round(seconds * 1000)), executors)


def exact(records: list[int], fixed: float = 15.0, per_record: float = 0.0005) -> list[CostObservation]:
    return [obs(n, fixed + per_record * n, batch_id=i) for i, n in enumerate(records)]


def test_no_observation_no_model():
    assert fit_cost([]) is None
    assert fit_cost([obs(0, 3.0), obs(100, 0.0)]) is None  # empty batches and zero times teach nothing


def test_one_observation_is_proportional_without_a_prior_and_anchored_with_one():
    fit = fit_cost([obs(1000, 20.0)])
    assert (fit.fixed_s, fit.method) == (0.0, "proportional")
    assert fit.per_record_s == pytest.approx(0.02)
    anchored = fit_cost([obs(1000, 20.0)], prior_fixed_s=15.0)
    assert anchored.method == "prior-fixed-cost"
    assert (anchored.fixed_s, anchored.per_record_s) == (15.0, pytest.approx(0.005))
    # a prior above what the batch took cannot be right: the batch bounds it
    assert fit_cost([obs(1000, 10.0)], prior_fixed_s=15.0).fixed_s == 10.0


def test_identical_sizes_cannot_measure_a_slope():
    fit = fit_cost(exact([60_000] * 6))
    assert fit.method == "proportional"
    assert fit.predict_s(60_000) == pytest.approx(45.0)  # still exact at the size it saw
    assert fit_cost(exact([60_000] * 6), prior_fixed_s=15.0).per_record_s == pytest.approx(0.0005)


def test_a_cold_first_batch_does_not_raise_the_per_record_cost_of_the_warm_ones():
    """The ten batches of a cost-mode run on a loaded machine (2026-11-29, the connect engine, 40 s
    interval): the first batch paid the session's cold start (640 records in 30.6 s), every later one
    measured 9.4-10.3 ms per record over a 1.9 s fixed cost. The fallback's per-record cost is the
    median of each batch's own; the median time over the median size (11.2 ms) paired two different
    batches and kept the pipeline at 0.50 of the interval against a target of 0.6."""
    run = [(640, 30.642), (500, 6.722), (732, 8.884), (1728, 19.064), (1176, 12.956)]
    run += [(1352, 14.917), (1752, 19.746), (1996, 22.539), (1848, 20.238), (1740, 19.192)]
    fit = fit_cost([obs(n, t, batch_id=i) for i, (n, t) in enumerate(run)], prior_fixed_s=1.9)
    assert fit.method == "prior-fixed-cost"
    assert 0.0094 <= fit.per_record_s <= 0.0103
    # sized for 24 s of a 40 s interval, a warm batch takes 0.6 of it (at 9.9 ms/record)
    records = fit.records_within(24.0)
    assert 0.57 <= (1.9 + 0.0099 * records) / 40 <= 0.63


SIX = [40_000, 60_000, 80_000, 100_000, 120_000, 140_000]


def test_exact_line_is_recovered_from_six_batches():
    assert fit_cost(exact(SIX[:5])).method == "proportional"  # fewer: the residuals cannot show the noise
    fit = fit_cost(exact(SIX))
    assert fit.method == "theil-sen"
    assert fit.fixed_s == pytest.approx(15.0, abs=1e-3)
    assert fit.per_record_s == pytest.approx(0.0005, rel=1e-6)
    assert fit.noise == pytest.approx(0.0, abs=1e-4)


def test_two_batches_need_a_known_noise_to_be_trusted():
    data = exact([30_000, 60_000])
    assert fit_cost(data).method == "proportional"  # noise unknown: two points could be anything
    fit = fit_cost(data, noise_hint=0.0)  # the times have been exact so far
    assert (fit.method, round(fit.fixed_s, 3)) == ("theil-sen", 15.0)


def test_an_outlier_does_not_move_the_fit():
    data = exact([40_000, 50_000, 60_000, 70_000, 80_000, 90_000, 100_000, 110_000])
    data[3] = obs(70_000, 200.0, batch_id=3)  # one batch hit a GC storm
    fit = fit_cost(data)
    assert fit.method == "theil-sen"
    assert fit.fixed_s == pytest.approx(15.0, abs=1.0)
    assert fit.per_record_s == pytest.approx(0.0005, rel=0.03)


def test_noise_too_large_for_the_size_spread_keeps_the_fallback():
    rng = random.Random(1)
    # sizes within ±10%, times ±20%: any slope would be noise
    data = [
        obs(int(60_000 * rng.uniform(0.9, 1.1)), 45.0 * rng.uniform(0.8, 1.2), batch_id=i) for i in range(12)
    ]
    fit = fit_cost(data)
    assert fit.method == "proportional"
    assert fit.noise > 0.05


def test_executors_divide_the_per_record_work():
    data = [obs(60_000, 15 + 0.0005 * 60_000 / e, executors=e, batch_id=e) for e in (1, 2, 3, 4, 5, 6)]
    fit = fit_cost(data)
    assert fit.fixed_s == pytest.approx(15.0, abs=1e-3)
    assert fit.predict_s(60_000, 2) == pytest.approx(30.0, abs=1e-3)
    assert fit.records_within(30.0, 2) == pytest.approx(60_000, rel=1e-4)


def test_records_within_and_fixed_share():
    fit = fit_cost(exact(SIX))
    assert fit.records_within(45.0) == pytest.approx(60_000, rel=1e-4)
    assert fit.records_within(10.0) == 0.0  # the fixed cost alone does not fit
    assert fit.fixed_share(60_000) == pytest.approx(15 / 45, rel=1e-3)
    flat = fit_cost(exact([10, 20, 30, 40, 50, 60], fixed=30.0, per_record=0.0))
    assert flat.per_record_s == 0.0 and math.isinf(flat.records_within(45.0))


def test_robust_spread():
    assert robust_spread([1.0, 2.0]) == 0.0  # too few values to tell
    assert robust_spread([0.0] * 9 + [100.0]) == 0.0  # one wild value does not count
    assert robust_spread([-1.0, 0.0, 1.0]) == pytest.approx(1.4826)


@pytest.mark.parametrize(
    "row, fragment",
    [
        ([1, 2, 3], "expected [batch_id, records, processing_ms, executors]"),
        ([1, -5, 3, 1], "records = -5"),
        ([1, 5, float("nan"), 1], "processing_ms = nan"),
        ([1, 5, 3.5, 1], "processing_ms = 3.5"),
        ("x", "expected"),
    ],
)
def test_stored_observations_are_checked(row, fragment):
    with pytest.raises(CostModelError) as e:
        CostObservation.from_list(row, "cost.observations[0]")
    assert "cost.observations[0]" in str(e.value) and fragment in str(e.value)


def test_observation_round_trip():
    o = CostObservation(7, 1200, 34_000, 2)
    assert CostObservation.from_list(o.to_list()) == o
    assert o.work_units == 600 and o.processing_s == 34.0


def test_observations_stored_before_the_start_up_was_measured_still_load():
    assert CostObservation.from_list([3, 100, 2500, 1]) == CostObservation(3, 100, 2500, 1, 0)
    o = CostObservation(3, 100, 2500, 1, 1700)
    assert CostObservation.from_list(o.to_list()) == o
    assert o.net() == CostObservation(3, 100, 800, 1, 0)
    assert CostObservation(3, 100, 500, 1, 900).net().processing_ms == 1  # a clock that put it all there


def test_the_fallback_measures_the_per_record_cost_near_the_largest_batch():
    # a cold start reading more each batch: each small batch's fixed cost per record is far above
    # what the largest one shows, and the largest one's own figure already bounds the cost
    fit = fit_cost([obs(100, 7.4), obs(616, 6.9)])
    assert fit.method == "proportional"
    assert fit.per_record_s == pytest.approx(6.9 / 616)
    # batches of about one size: the median of them all, as before (robust to one of them)
    steady = fit_cost([obs(1000, 20.0), obs(900, 30.0), obs(1100, 21.0)], prior_fixed_s=10.0)
    assert steady.per_record_s == pytest.approx(statistics.median([0.01, 20 / 900, 11 / 1100]))
