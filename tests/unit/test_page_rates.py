"""The monitoring page's arrival rate (pure): records that arrived per second of input between two
plans, the quantity the rate limit is comparable with."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.plugins.views import with_arrival_rates


def view(batch_id: int, created_s: float, planned: int, lag: int) -> dict:
    return {
        "batch_id": batch_id,
        "created_at_ms": int(created_s * 1000),
        "planned_records": planned,
        "lag": lag,
        "arrival_per_s": None,
    }


def test_arrivals_are_the_planned_records_and_the_change_in_lag_over_the_time_between_plans():
    views = with_arrival_rates([view(3, 120, 900, 100), view(1, 0, 500, 1000), view(2, 60, 1200, 400)])
    by_id = {v["batch_id"]: v["arrival_per_s"] for v in views}
    assert by_id[1] is None  # the oldest shown: no plan before it
    assert by_id[2] == pytest.approx((1200 + 400 - 1000) / 60)  # 10/s
    assert by_id[3] == pytest.approx((900 + 100 - 400) / 60)  # 10/s: the rate limit read beside it


def test_a_plan_at_the_same_moment_or_a_shrinking_backlog_gives_no_negative_rate():
    views = with_arrival_rates([view(1, 0, 0, 1000), view(2, 0, 10, 0), view(3, 30, 0, 0)])
    assert [v["arrival_per_s"] for v in views] == [None, None, 0.0]
