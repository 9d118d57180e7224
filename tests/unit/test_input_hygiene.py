"""Controller input hygiene (issue 8, item 4): what reaches the controller is what happened.

* a cleared or re-run *scheduled* run does not feed its age as scheduling delay;
* min_rate below 1 record/s, NaN and infinities in the settings or the state are refused by name;
* no batch is unlimited by default: a default maximum caps the first batch and every later one,
  in both modes, and it is settable.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kafka_backpressure.batch.models import BatchPlan, OffsetRange, TopicPartition
from airflow_kafka_backpressure.config.settings import (
    DEFAULT_MAX_RECORDS_PER_BATCH,
    SettingsError,
    parse_settings,
)
from airflow_kafka_backpressure.control.allocation import plan_ranges
from airflow_kafka_backpressure.control.controller import ControllerStateError, PipelineController
from airflow_kafka_backpressure.control.cost_mode import PlanInputs
from airflow_kafka_backpressure.operators.record import scheduling_delay_ms

DUE = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
INTERVAL_MS = 60_000


def dag_run(run_type: str, *, clear_number: int = 0, start_date: datetime | None = None):
    """The DAG run as a task sees it (the Task SDK's own model, as in ``context["dag_run"]``)."""
    from airflow.sdk.api.datamodels._generated import DagRun

    return DagRun(
        dag_id="kbp_ingest_p",
        run_id=f"{run_type}__{DUE.isoformat()}",
        logical_date=DUE,
        data_interval_start=DUE - timedelta(minutes=1),
        data_interval_end=DUE,
        run_after=DUE,
        start_date=start_date or DUE,
        end_date=None,
        clear_number=clear_number,
        run_type=run_type,
        state="running",
        consumed_asset_events=[],
        partition_key=None,
    )


def plan(planned_at: datetime) -> BatchPlan:
    return BatchPlan(
        "p", 7, "r", (OffsetRange("t", 0, 0, 10),), "/sink", INTERVAL_MS, int(planned_at.timestamp() * 1000)
    )


# ----- scheduling delay ------------------------------------------------------------------------


def test_a_scheduled_runs_delay_is_how_late_its_batch_was_first_planned():
    assert scheduling_delay_ms(dag_run("scheduled"), plan(DUE + timedelta(seconds=2))) == 2_000


def test_a_run_cleared_a_day_later_feeds_its_first_delay_not_its_age():
    # the first attempt planned 2 s late and failed in ingest; cleared a day later, the re-run
    # reuses that plan (Airflow moved the run's start_date to the re-run)
    rerun = dag_run("scheduled", clear_number=1, start_date=DUE + DAY)
    assert scheduling_delay_ms(rerun, plan(DUE + timedelta(seconds=2))) == 2_000


def test_a_run_cleared_before_it_ever_planned_feeds_no_delay():
    # the first attempt failed before planning; the plan is made by the re-run, a day late
    rerun = dag_run("scheduled", clear_number=1, start_date=DUE + DAY)
    assert scheduling_delay_ms(rerun, plan(DUE + DAY + timedelta(seconds=1))) == 0


@pytest.mark.parametrize("run_type", ["manual", "backfill", "asset_triggered"])
def test_runs_not_started_by_the_schedule_feed_no_delay(run_type):
    assert scheduling_delay_ms(dag_run(run_type), plan(DUE + DAY)) == 0
    assert scheduling_delay_ms(dag_run("scheduled"), None) == 0  # no plan: nothing to measure


def pid_rate_after(delay_ms: int) -> float:
    """Spark's PID after a steady batch and then one fed ``delay_ms`` of scheduling delay."""
    c = PipelineController.new("spark", parse_settings(None), INTERVAL_MS)
    c.on_batch_completed(
        batch_id=1, time_ms=60_000, records=600_000, processing_ms=60_000, scheduling_delay_ms=0
    )
    c.on_batch_completed(
        batch_id=2, time_ms=120_000, records=600_000, processing_ms=60_000, scheduling_delay_ms=delay_ms
    )
    return c.modes["spark"].rate.latest_rate  # type: ignore[attr-defined]


def test_the_pid_keeps_its_rate_when_a_day_old_run_is_cleared():
    rerun = dag_run("scheduled", clear_number=1, start_date=DUE + DAY)
    fed = scheduling_delay_ms(rerun, plan(DUE + timedelta(seconds=2)))
    assert (
        pid_rate_after(fed)
        == pytest.approx(pid_rate_after(2_000), rel=1e-3)
        == pytest.approx(10_000, rel=0.01)
    )
    # what the age would have done (the bug of the issue): the rate falls to Spark's 100 floor
    assert pid_rate_after(int(DAY.total_seconds() * 1000)) == 100.0


# ----- refused values --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"min_rate": 0.5}', "'min_rate'"),
        ('{"min_rate": 0}', "'min_rate'"),
        ('{"proportional": NaN}', "'proportional'"),
        ('{"target_ratio": Infinity}', "'target_ratio'"),
        ('{"drain_horizon_s": -Infinity}', "'drain_horizon_s'"),
        ('{"max_records_per_batch": Infinity}', "'max_records_per_batch'"),
        ('{"max_rate_per_topic": {"orders": NaN}}', "max_rate_per_topic.orders"),
        ('{"max_records_per_batch": 0}', "'max_records_per_batch'"),
    ],
)
def test_settings_refuse_min_rate_below_one_and_non_finite_numbers(text, key):
    with pytest.raises(SettingsError) as e:
        parse_settings(text, source="Variable 'kbp.p.controller_settings'")
    assert str(e.value).startswith("Variable 'kbp.p.controller_settings'") and key in str(e.value)


def fed_state() -> dict:
    s = parse_settings(None)
    c = PipelineController.new("cost", s, INTERVAL_MS)
    for i, n in enumerate([1000, 2000, 1500]):
        c.on_batch_completed(
            batch_id=i + 1,
            time_ms=60_000 * (i + 1),
            records=n,
            processing_ms=5_000 + 10 * n,
            scheduling_delay_ms=0,
        )
    return json.loads(json.dumps(c.to_dict(s.cost_params(), 60.0)))


@pytest.mark.parametrize(
    "edit, where",
    [
        (lambda d: d["spark"].update(rate_limit=float("inf")), "spark.rate_limit = inf"),
        (
            lambda d: d["spark"]["estimator"]["state"].update(latest_error=float("nan")),
            "spark.estimator.state.latest_error = nan",
        ),
        (lambda d: d["spark"]["estimator"].update(min_rate=float("-inf")), "spark.estimator.min_rate = -inf"),
        (lambda d: d["cost"]["observations"][0].__setitem__(2, float("inf")), "cost.observations[0]"),
        (lambda d: d["cost"].update(errors=[0.1, float("nan")]), "cost.errors"),
        (lambda d: d["spark"].update(rate_limit=0.5), "rate_limit = 0"),  # truncates to 0: 'unlimited'
    ],
)
def test_a_state_with_non_finite_or_unlimited_values_is_refused(edit, where):
    d = fed_state()
    edit(d)
    text = json.dumps(d)  # json writes NaN / Infinity, as a hand edit in the UI could
    with pytest.raises(ControllerStateError) as e:
        PipelineController.from_dict(
            json.loads(text),
            "cost",
            parse_settings(None),
            INTERVAL_MS,
            where="Variable 'kbp.p.controller_state'",
        )
    assert "Variable 'kbp.p.controller_state'" in str(e.value) and where in str(e.value), str(e.value)


# ----- the default maximum batch ---------------------------------------------------------------

TPS = [TopicPartition("t", i) for i in range(4)]
BIG = {tp: 3_000_000 for tp in TPS}  # 12 million records waiting


def planned(settings, rate: float | None) -> int:
    alloc = plan_ranges(
        {tp: 0 for tp in TPS},
        {tp: 0 for tp in TPS},
        BIG,
        batch_interval_ms=INTERVAL_MS,
        limits=settings.rate_limits(TPS),
        latest_rate=rate,
    )
    return sum(r.count for r in alloc.ranges)


def test_the_first_batch_of_a_new_pipeline_is_capped_by_default():
    s = parse_settings(None)
    assert s.max_records_per_batch == DEFAULT_MAX_RECORDS_PER_BATCH
    assert planned(s, -1) == DEFAULT_MAX_RECORDS_PER_BATCH  # no estimate yet, no initial rate
    assert planned(s, None) == DEFAULT_MAX_RECORDS_PER_BATCH  # backpressure off: still capped


def test_every_later_batch_is_capped_in_both_modes():
    s = parse_settings(None)
    assert planned(s, 1e9) == DEFAULT_MAX_RECORDS_PER_BATCH  # a PID rate of a billion records/s
    # the cost mode with a model that would take everything (the fixed-cost regime)
    c = PipelineController.new("cost", s, INTERVAL_MS)
    for i, n in enumerate([200_000, 500_000, 1_000_000] * 3):  # every size takes 120 s: all fixed cost
        c.on_batch_completed(
            batch_id=i + 1, time_ms=1, records=n, processing_ms=120_000, scheduling_delay_ms=0
        )
    decision = c.plan(
        s.cost_params(), PlanInputs(lag=12_000_000, batch_interval_s=60.0, arrivals_per_s=100_000.0)
    )
    assert decision.budget.regime == "fixed-cost" and decision.rate * 60 > DEFAULT_MAX_RECORDS_PER_BATCH
    assert planned(s, decision.rate) == DEFAULT_MAX_RECORDS_PER_BATCH


def test_the_maximum_is_settable():
    s = parse_settings('{"max_records_per_batch": 5000}')
    assert planned(s, -1) == planned(s, 1e9) == 5000
    assert planned(parse_settings('{"max_records_per_batch": 20000000}'), -1) == 12_000_000
