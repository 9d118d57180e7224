"""The queue model behaves like the pipeline under Airflow, and the shipped scenarios meet the
bench's criteria (deterministic figures of the model with fixed seeds, not wall times)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from airflow_kafka_backpressure.config.settings import ControllerSettings, parse_settings
from airflow_kafka_backpressure.sim import scenarios
from airflow_kafka_backpressure.sim.simulate import (
    ArrivalProfile,
    CapacityProfile,
    Scenario,
    physical_drain_batches,
    simulate,
)

SPARK = parse_settings('{"mode": "spark"}')
COST = parse_settings('{"mode": "cost"}')


def steady(**kw) -> Scenario:
    base = dict(
        name="t",
        description="",
        batch_interval_s=60.0,
        duration_s=20 * 60.0,
        arrivals=ArrivalProfile(100.0),
        capacity=CapacityProfile(10.0, 0.001),
        scheduler_latency_s=2.0,
    )
    return Scenario(**{**base, **kw})


def test_arrivals_profile():
    a = ArrivalProfile(10.0, steps=((100.0, 20.0),), bursts=((50.0, 1000),), backlog=5)
    assert a.arrived(0) == 5
    assert a.arrived(50) == 5 + 500 + 1000
    assert a.arrived(150) == 5 + 1000 + 1000 + 1000
    assert a.rate_at(99) == 10.0 and a.rate_at(100) == 20.0


def test_runs_start_on_schedule_plus_latency_and_read_what_arrived():
    r = simulate(steady(), COST)
    first, second = r.rows[0], r.rows[1]
    assert (first.run_after, first.start, first.scheduling_delay) == (60.0, 62.0, 2.0)
    assert first.available == 6_200  # 100/s for 62 s
    assert second.run_after == 120.0 and second.available == 6_000
    assert all(row.processing == pytest.approx(10 + 0.001 * row.records) for row in r.rows)


def test_a_run_longer_than_the_interval_delays_the_next_one_as_airflow_does():
    slow = steady(capacity=CapacityProfile(100.0, 0.001))  # every batch takes over 100 s
    rows = simulate(slow, SPARK).rows
    r0, r1, r2 = rows[:3]
    assert r1.start == pytest.approx(r0.end + 2.0)  # max_active_runs=1: it waits for the previous run
    assert r1.run_after == 120.0 and r1.scheduling_delay == pytest.approx(r0.end + 2.0 - 120.0)
    # Airflow's delta timetable with catchup=False skips the intervals a long run missed
    assert r2.run_after == math.floor(r1.end / 60.0) * 60.0
    assert r2.run_after > r1.run_after + 60.0


def test_empty_batches_take_no_time_and_noise_is_seeded():
    idle = simulate(steady(arrivals=ArrivalProfile(0.0)), COST)
    assert all(row.records == 0 and row.processing == 0 for row in idle.rows)
    noisy = CapacityProfile(10.0, 0.01, noise=0.2, seed=4)
    assert noisy.noise_series(5) == CapacityProfile(10.0, 0.01, noise=0.2, seed=4).noise_series(5)
    assert noisy.noise_series(5) != CapacityProfile(10.0, 0.01, noise=0.2, seed=5).noise_series(5)
    drift = CapacityProfile(10.0, 0.01, noise=0.2, noise_kind="drift", seed=4).noise_series(500)
    assert max(abs(w) for w, _ in drift) <= 0.2
    assert max(abs(a[0] - b[0]) for a, b in zip(drift, drift[1:])) <= 0.05 + 1e-12


def test_physical_drain_limit():
    # 1,320,000 behind, 90,000 per whole-interval batch, 60,000 arriving: the issue's 44 batches
    assert physical_drain_batches(1_320_000 + 60_000, 90_000, 60_000) == pytest.approx(44.0)
    assert physical_drain_batches(50_000, 90_000, 60_000) == 1.0
    assert math.isinf(physical_drain_batches(1e6, 60_000, 60_000))


def test_the_simulator_uses_the_settings_like_the_pipeline():
    capped = simulate(
        steady(arrivals=ArrivalProfile(0.0, backlog=500_000)),
        parse_settings('{"max_records_per_batch": 1234}'),
    )
    assert capped.rows[0].records == 1234
    spark = simulate(steady(), SPARK)
    assert spark.rows[0].regime == "initial" and spark.rows[-1].regime == "pid"


def figures(scenario: Scenario, settings: ControllerSettings):
    return simulate(scenario, settings).figures()


FLOOR = parse_settings({"backpressure_enabled": False, "max_records_per_batch": 10**12})


@pytest.mark.parametrize("name", sorted(scenarios.criteria()))
def test_bench_criteria(name):
    """Issue 23's criteria for the cost mode with its default gains, as bench/controller.py checks
    them: every shipped scenario, 20 seeds × 300 intervals."""
    s = scenarios.sweep(scenarios.shipped()[name], {"cost": COST}, FLOOR)
    for c in scenarios.criteria()[name]:
        assert c.passed(s, "cost"), (c.label, c.value(s, "cost"), c.describe())


def test_the_floor_reads_exactly_what_arrived_and_is_judged_against():
    s = scenarios.sweep(scenarios.noise_90(), {"cost": COST}, FLOOR, seeds=(1, 2))
    assert all(f.read_share == 1.0 for f in s.floor)
    # unpredictable noise: even reading exactly what arrived runs over the interval about 1 in 10
    assert 0.05 < s.pooled_over_share(s.floor) < 0.15


def test_seeds_without_noise_are_one_run():
    s = scenarios.sweep(scenarios.burst(), {"cost": COST}, FLOOR, seeds=(1, 2, 3))
    assert not scenarios.seeded(s.scenario) and len(set(map(id, s.by_mode["cost"]))) == 1
    assert s.scenario.batches == scenarios.INTERVALS


def test_a_burst_after_a_trickle_is_read_at_once():
    """Issue 23 item 2: growth is bounded by the model's predicted time, not by the sizes seen."""
    sc = scenarios.trickle_burst()
    rows = simulate(sc, COST).rows
    burst = next(r for r in rows if r.start >= sc.drain_from_s)
    assert max(r.records for r in rows if r.start < sc.drain_from_s and r.start > 30 * 60) < 400  # a trickle
    # the first batch after the burst is already the largest the interval holds (max_ratio 0.99)
    assert burst.records > 0.95 * sc.physical_batch(burst.start)
    assert burst.processing <= sc.batch_interval_s


def test_under_noise_the_correction_keeps_up_where_the_feedforward_alone_falls_behind():
    """Issue 23 item 1: the feedforward reads what arrives, but with ±40% noise at 90% load its
    noise margin leaves nothing for the backlog that runs over the interval leave behind: without
    the correction (gains 0) it grows. The correction's integral drains it."""
    sc = scenarios.extended(scenarios.noise_90(seed=3))
    sc = replace(sc, capacity=replace(sc.capacity, noise=0.4))
    off = simulate(sc, parse_settings({"proportional": 0, "integral": 0, "derivative": 0})).figures()
    on = simulate(sc, COST).figures()
    per_batch = sc.arrivals.rate * sc.batch_interval_s
    assert not off.lag_bounded(per_batch) and off.read_share < 0.99
    assert on.lag_bounded(per_batch) and on.read_share > 0.999


def test_the_cost_mode_drains_faster_than_spark_after_a_drop():
    for sc in (scenarios.issue_drop(), scenarios.drop_30()):
        assert figures(sc, COST).drain_factor < figures(sc, SPARK).drain_factor


def test_fixed_cost_over_the_interval_keeps_up_where_spark_collapses():
    sc = scenarios.fixed_over_interval()
    spark, cost = simulate(sc, SPARK), simulate(sc, COST)
    per_batch = sc.arrivals.rate * sc.batch_interval_s
    assert cost.figures().lag_bounded(per_batch) and not spark.figures().lag_bounded(per_batch)
    assert (
        cost.warning
        == "fixed cost 36.0 s is 120% of the interval: raise the interval or use the connect engine"
    )
    # once the fixed cost is measured (a few batches of different sizes), every batch takes it all
    assert {row.regime for row in cost.rows[10:]} == {"fixed-cost"}


def test_every_shipped_scenario_runs_under_both_modes():
    for sc in scenarios.shipped().values():
        for settings in (SPARK, COST):
            f = figures(sc, settings)
            assert f.batches > 10 and f.throughput > 0
