"""Controller input hygiene: what reaches the controller, and what it may hand the planner.

* a cleared or re-run scheduled run feeds the delay of its first start, not its age;
* ``min_rate`` below 1 record/s, NaN and infinities are refused in settings and in the state;
* no batch is unlimited: a default ``max_records_per_batch`` caps the first batches and any other.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from airflow_kafka_backpressure.batch.models import BatchPlan, OffsetRange, TopicPartition
from airflow_kafka_backpressure.config.settings import (
    DEFAULT_MAX_RECORDS_PER_BATCH,
    ControllerSettings,
    SettingsError,
    parse_settings,
)
from airflow_kafka_backpressure.control.allocation import plan_ranges
from airflow_kafka_backpressure.control.controller import ControllerStateError, PipelineController
from airflow_kafka_backpressure.control.pid import PIDRateEstimator, RateController
from airflow_kafka_backpressure.operators.record import scheduling_delay_ms

DUE = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
DUE_MS = int(DUE.timestamp() * 1000)


def plan(planned_at_ms: int) -> BatchPlan:
    return BatchPlan(
        "p",
        7,
        "scheduled__2026-03-01T12:00:00+00:00",
        (OffsetRange("t", 0, 0, 10),),
        "/s",
        60_000,
        planned_at_ms,
    )


def controller_at_10000() -> RateController:
    """A PID that publishes 10,000 records/s: 600,000 records per minute, processed in 60 s."""
    rc = RateController(PIDRateEstimator(60_000, 1.0, 0.2, 0.0, 100.0))
    for i in range(1, 4):
        rc.on_batch_completed(60_000 * i, 600_000, 60_000, 0)
    assert rc.latest_rate == 10_000
    return rc


def test_a_cleared_scheduled_run_feeds_its_first_start_not_its_age():
    first_plan = plan(DUE_MS + 2_000)  # the run started 2 s after it was due and planned its batch
    cleared = SimpleNamespace(run_type="scheduled", run_after=DUE, start_date=DUE + timedelta(days=1))
    assert scheduling_delay_ms(cleared, first_plan) == 2_000

    kept, dropped = controller_at_10000(), controller_at_10000()
    kept.on_batch_completed(60_000 * 4, 600_000, 60_000, scheduling_delay_ms(cleared, first_plan))
    assert kept.latest_rate >= 9_900
    # what feeding the run's age did: one cleared day-old run sank the rate to the floor
    age = int((cleared.start_date - cleared.run_after).total_seconds() * 1000)
    dropped.on_batch_completed(60_000 * 4, 600_000, 60_000, age)
    assert dropped.latest_rate == 100


def test_manual_and_backfill_runs_feed_no_delay():
    for run_type in ("manual", "backfill", "asset_triggered"):
        run = SimpleNamespace(run_type=run_type, run_after=DUE, start_date=DUE + timedelta(hours=3))
        assert scheduling_delay_ms(run, plan(DUE_MS + 10_800_000)) == 0
    on_time = SimpleNamespace(run_type="DagRunType.SCHEDULED", run_after=DUE, start_date=DUE)
    assert scheduling_delay_ms(on_time, None) == 0  # no plan stored: nothing trustworthy to feed
    assert scheduling_delay_ms(on_time, plan(DUE_MS - 5)) == 0  # clocks: never negative


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('{"min_rate": 0.5}', ["'min_rate' = 0.5", "[1, inf)", "'unlimited'"]),
        ('{"min_rate": NaN}', ["'min_rate'", "not a finite number"]),
        ('{"proportional": Infinity}', ["'proportional'", "not a finite number"]),
        ('{"target_ratio": -Infinity}', ["'target_ratio'", "not a finite number"]),
        ('{"max_records_per_batch": 0}', ["'max_records_per_batch' = 0", "[1, inf)"]),
        ('{"drain_horizon_s": 1e999}', ["'drain_horizon_s'", "not a finite number"]),
    ],
)
def test_settings_refuse_tiny_min_rates_nan_and_infinities(text, fragments):
    with pytest.raises(SettingsError) as e:
        parse_settings(text, source="Variable 'kbp.p.settings'")
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


@pytest.mark.parametrize(
    "state, fragment",
    [
        ({"latest_rate": float("nan")}, "latest_rate = nan"),
        ({"latest_error": float("inf")}, "latest_error = inf"),
    ],
)
def test_the_state_variable_refuses_nan_and_infinities(state, fragment):
    rc = controller_at_10000()
    d = json.loads(
        json.dumps(
            {
                **rc.to_dict(),
                "estimator": {**rc.estimator.to_dict(), "state": {**rc.estimator.state(), **state}},
            }
        )
    )
    with pytest.raises(ControllerStateError) as e:
        PipelineController.from_dict(
            d, "spark", parse_settings(None), 60_000, where="Variable 'kbp.p.controller_state'"
        )
    assert "Variable 'kbp.p.controller_state'" in str(e.value) and fragment in str(e.value)


def test_a_stored_rate_limit_of_zero_is_refused_not_read_as_unlimited():
    d = {**controller_at_10000().to_dict(), "rate_limit": 0}
    with pytest.raises(ControllerStateError, match="'unlimited'"):
        PipelineController.from_dict(d, "spark", parse_settings(None), 60_000)


TPS = [TopicPartition("t", p) for p in range(4)]


def first_plan(
    settings: ControllerSettings, latest_rate: float | None, sizes=(2_000_000, 1_000_000, 1_500_000, 500_000)
):
    latest = dict(zip(TPS, sizes))
    return plan_ranges(
        {},
        {tp: 0 for tp in TPS},
        latest,
        batch_interval_ms=60_000,
        limits=settings.rate_limits(TPS),
        latest_rate=latest_rate,
        starting_offsets="earliest",
    )


def test_the_first_batch_of_a_new_pipeline_is_capped_by_default():
    a = first_plan(ControllerSettings(), latest_rate=-1)  # no estimate, no initial rate
    assert a.records == DEFAULT_MAX_RECORDS_PER_BATCH and a.limited
    # shared in proportion to what each partition holds
    assert [r.count for r in a.ranges] == [400_000, 200_000, 300_000, 100_000]


def test_any_batch_is_capped_and_the_cap_is_settable():
    huge_rate = 10**9
    assert first_plan(ControllerSettings(), huge_rate).records == DEFAULT_MAX_RECORDS_PER_BATCH
    assert (
        first_plan(ControllerSettings(backpressure_enabled=False), None).records
        == DEFAULT_MAX_RECORDS_PER_BATCH
    )
    small = parse_settings('{"max_records_per_batch": 5001}')
    assert first_plan(small, huge_rate).records == 5001
    # below the cap nothing changes
    assert first_plan(ControllerSettings(), -1, sizes=(10, 20, 30, 40)).records == 100
