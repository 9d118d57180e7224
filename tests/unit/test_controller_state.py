"""The pipeline controller: every mode fed every batch, the spark mode bit-identical to the PID,
each mode's state under its name, and a state Variable that old pipelines can still load."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.config.settings import parse_settings
from airflow_kafka_backpressure.control.controller import (
    COST,
    DEFAULT_MODE,
    SPARK,
    ControllerStateError,
    PipelineController,
)
from airflow_kafka_backpressure.control.cost_mode import CostParams, PlanInputs
from airflow_kafka_backpressure.control.pid import PIDRateEstimator, RateController

B_MS = 60_000
BATCHES = [
    (60_000 * (i + 1), 40_000 + 7_000 * (i % 3), 30_000 + 4_000 * (i % 3), 1_000 * (i % 2)) for i in range(8)
]


def estimator(**kw) -> PIDRateEstimator:
    return PIDRateEstimator(B_MS, **{"min_rate": 100.0, **kw})


def settings(**kw):
    """The settings Variable that builds :func:`estimator` (and the rest at their defaults)."""
    return parse_settings({"min_rate": 100.0, **kw})


def rate(c: PipelineController) -> RateController:
    return c.modes[SPARK].rate  # type: ignore[attr-defined]


def cost(c: PipelineController):
    return c.modes[COST].model  # type: ignore[attr-defined]


def fed(mode: str) -> PipelineController:
    c = PipelineController.new(mode, settings(), B_MS)
    for i, (t, n, proc, sched) in enumerate(BATCHES):
        c.on_batch_completed(
            batch_id=i + 1, time_ms=t, records=n, processing_ms=proc, scheduling_delay_ms=sched
        )
    return c


def test_spark_mode_plans_with_the_pid_rate_bit_for_bit():
    reference = RateController(estimator())
    for t, n, proc, sched in BATCHES:
        reference.on_batch_completed(t, n, proc, sched)
    c = fed(SPARK)
    assert rate(c).to_dict() == reference.to_dict()
    d = c.plan(CostParams(), PlanInputs(lag=10**9, batch_interval_s=60.0))
    assert (d.mode, d.rate, d.budget) == (SPARK, float(reference.latest_rate), None)


def test_both_models_learn_whatever_the_mode():
    spark, cost_fed = fed(SPARK), fed(COST)
    assert rate(spark).to_dict() == rate(cost_fed).to_dict()
    assert globals()["cost"](spark).to_dict() == globals()["cost"](cost_fed).to_dict()
    d = cost_fed.plan(CostParams(), PlanInputs(lag=10**9, batch_interval_s=60.0))
    assert d.mode == COST and d.budget is not None and d.rate == pytest.approx(d.budget.records / 60.0)


def test_each_mode_keeps_its_state_under_its_name():
    c = fed(COST)
    d = json.loads(json.dumps(c.to_dict(CostParams(target_ratio=0.7), 60.0)))
    assert set(d) == {SPARK, COST, "mode", "waiting", "last_plan"}
    assert {"estimator", "rate_limit", "last_batch"} <= set(d[SPARK])
    assert d[SPARK]["rate_limit"] == rate(c).rate_limit and d["mode"] == COST
    assert d["cost"]["target_ratio"] == 0.7 and set(d["cost"]["fit"]) >= {"fixed_s", "per_record_s", "noise"}
    assert "warning" in d["cost"]
    again = PipelineController.from_dict(d, COST, settings(), B_MS)
    assert again.to_dict() == c.to_dict()


def test_a_state_written_before_the_cost_mode_still_loads():
    legacy = RateController(estimator())
    for t, n, proc, sched in BATCHES[:3]:
        legacy.on_batch_completed(t, n, proc, sched)
    c = PipelineController.from_dict(json.loads(json.dumps(legacy.to_dict())), DEFAULT_MODE, settings(), B_MS)
    assert rate(c).to_dict() == legacy.to_dict()
    assert cost(c).observations == [] and c.mode == DEFAULT_MODE


def test_a_state_of_the_last_release_layout_still_loads_and_is_saved_under_the_modes_names():
    """The PID's state at the top level and the cost model under "cost", as the last release wrote it."""
    c = fed(COST)
    old = {**c.to_dict()[SPARK], "cost": c.to_dict()[COST], "mode": COST, "waiting": None, "last_plan": None}
    again = PipelineController.from_dict(json.loads(json.dumps(old)), COST, settings(), B_MS)
    assert again.to_dict() == c.to_dict()


def test_new_gains_reapply_the_last_batch():
    c = fed(SPARK)
    d = c.to_dict()
    retuned = PipelineController.from_dict(d, SPARK, settings(proportional=0.5), B_MS)
    assert rate(retuned).rate_limit != rate(c).rate_limit
    assert rate(retuned).params()["proportional"] == 0.5


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (
            lambda d: d[SPARK]["estimator"]["state"].update(latest_rate=float("nan")),
            "spark.estimator.state.latest_rate = nan",
        ),
        (lambda d: d[SPARK]["estimator"].update(integral=float("inf")), "spark.estimator.integral = inf"),
        (lambda d: d[SPARK].update(rate_limit=0), "spark.rate_limit = 0"),
        (lambda d: d["cost"].update(fixed_prior_s=float("-inf")), "fixed_prior_s"),
        (lambda d: d["cost"]["observations"].append([1, 2]), "cost.observations"),
        (lambda d: d[SPARK].pop("estimator"), "not a controller state"),
        (lambda d: [d.pop(SPARK), d.pop(COST)], "not a controller state"),
    ],
)
def test_a_broken_state_is_refused_naming_the_key(edit, fragment):
    d = fed(COST).to_dict()
    edit(d)
    with pytest.raises(ControllerStateError) as e:
        PipelineController.from_dict(d, COST, settings(), B_MS, where="Variable 'kbp.p.controller_state'")
    assert "Variable 'kbp.p.controller_state'" in str(e.value) and fragment in str(e.value)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        PipelineController.new("fast", settings(), B_MS)


def test_the_cost_mode_feeds_its_correction_and_the_spark_mode_resets_it():
    """Issue 23: in the cost mode a budget that left work behind raises the correction; the state
    shows each term; the spark mode (whose plans are the PID's) resets it."""
    c = fed(COST)
    params = CostParams()
    c.on_batch_completed(
        batch_id=99,
        time_ms=10**7,
        records=50_000,
        processing_ms=40_000,
        scheduling_delay_ms=0,
        params=params,
        left_behind=20_000,
        budget=50_000.0,
        batch_interval_s=60.0,
    )
    assert cost(c).correction.error > 0 and cost(c).correction.integral > 0
    terms = c.to_dict(params, 60.0)["cost"]["correction"]["terms"]
    assert set(terms) == {"error", "proportional", "integral", "derivative", "output"} and terms["output"] > 0
    again = PipelineController.from_dict(
        json.loads(json.dumps(c.to_dict(params, 60.0))), COST, settings(), B_MS
    )
    assert cost(again).correction == cost(c).correction
    spark = PipelineController.from_dict(c.to_dict(params, 60.0), SPARK, settings(), B_MS)
    spark.on_batch_completed(
        batch_id=100,
        time_ms=10**7 + 60_000,
        records=50_000,
        processing_ms=40_000,
        scheduling_delay_ms=0,
        params=params,
        left_behind=20_000,
        budget=50_000.0,
        batch_interval_s=60.0,
    )
    assert cost(spark).correction.integral == 0 and cost(spark).correction.error is None


def test_a_run_waits_for_data_below_the_minimum_until_the_delay_has_passed():
    """Issue 23 item 3 (minOffsetsPerTrigger + maxTriggerDelay)."""
    from airflow_kafka_backpressure.control.controller import wait_for_data

    w = wait_for_data(40, 100, 60.0, last_planned_at_ms=1_000_000, now_ms=1_030_000)
    assert w is not None and (w.available, w.min_records, w.batch_by_ms) == (40, 100, 1_060_000)
    assert "waiting for data: 40 records available, below min_records_per_batch = 100" in w.reason()
    assert wait_for_data(40, 100, 60.0, 1_000_000, 1_060_000) is None  # the delay has passed
    assert wait_for_data(100, 100, 60.0, 1_000_000, 1_030_000) is None  # enough data
    assert wait_for_data(40, 0, 60.0, 1_000_000, 1_030_000) is None  # no minimum
    assert wait_for_data(40, 100, 60.0, None, 1_030_000) is None  # no batch yet: the first one runs


def test_waiting_is_in_the_state_until_the_next_batch():
    from airflow_kafka_backpressure.control.controller import wait_for_data

    c = fed(COST)
    c.waiting = wait_for_data(40, 100, 60.0, 1_000_000, 1_030_000)
    d = json.loads(json.dumps(c.to_dict(CostParams(), 60.0)))
    assert d["waiting"]["available"] == 40
    again = PipelineController.from_dict(d, COST, settings(), B_MS)
    assert again.waiting == c.waiting
    again.on_batch_completed(
        batch_id=50, time_ms=10**8, records=120, processing_ms=5_000, scheduling_delay_ms=0
    )
    assert again.waiting is None and again.to_dict()["waiting"] is None
    with pytest.raises(ControllerStateError, match=r"controller state.waiting = .* is invalid"):
        PipelineController.from_dict({**d, "waiting": {"available": -1}}, COST, settings(), B_MS)


def test_modes_are_one_interface_dispatched_from_one_registry():
    """Issue 23 item 5: spark and cost implement ControlMode; the controller dispatches by name."""
    from airflow_kafka_backpressure.config.settings import RULES
    from airflow_kafka_backpressure.control.controller import MODES
    from airflow_kafka_backpressure.control.modes import REGISTRY, ControlMode
    from airflow_kafka_backpressure.control.scaling import ScalingPolicy, executor_target

    assert tuple(REGISTRY) == tuple(MODES) == tuple(RULES["mode"].choices)
    for name, cls in REGISTRY.items():
        assert issubclass(cls, ControlMode) and cls.name == name
        assert set(cls.settings_keys) <= set(RULES)  # its own settings are settings keys
    c = fed(SPARK)
    window = [(40_000, 58_000), (47_000, 57_000)]  # ratio 0.96: above scaling_up_ratio
    d = c.suggest_executors(2, window, B_MS, CostParams(), ScalingPolicy(), None)
    assert d == executor_target(2, [58_000, 57_000], B_MS, ScalingPolicy(), None)
    cost = fed(COST)
    assert (
        "dominates" in cost.suggest_executors(2, window, B_MS, CostParams(), ScalingPolicy(), None).reason
    )  # the cost model judges


def test_the_last_plan_is_kept_for_the_page_and_refused_when_broken():
    """Issue 23 item 4: the page shows the active mode's figure and regime from the state."""
    c = fed(COST)
    d = c.plan(CostParams(), PlanInputs(lag=10**9, batch_interval_s=60.0)).to_dict()
    assert d["mode"] == COST and d["regime"] in ("drain", "capacity", "fixed-cost") and d["rate"] > 0
    assert d["budget_records"] == int(d["rate"] * 60) or abs(d["budget_records"] - d["rate"] * 60) < 1
    spark = fed(SPARK).plan(CostParams(), PlanInputs(lag=10**9, batch_interval_s=60.0)).to_dict()
    assert spark["regime"] == "pid" and spark["budget_records"] is None
    c.last_plan = d
    again = PipelineController.from_dict(json.loads(json.dumps(c.to_dict())), COST, settings(), B_MS)
    assert again.last_plan == d
    with pytest.raises(ControllerStateError, match="last_plan = 3 is invalid"):
        PipelineController.from_dict({**c.to_dict(), "last_plan": 3}, COST, settings(), B_MS)
