"""A control mode added from outside the package (here, a test) is one class and one registry line:
the settings accept its name, the controller feeds it every batch with the others, keeps its state
under its name, plans with it when it is the active mode, and the operators' questions (the
smallest batch, warnings, the record task's figures) reach it — no existing module names it."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from airflow_kafka_backpressure.config.settings import parse_settings
from airflow_kafka_backpressure.control import modes
from airflow_kafka_backpressure.control.controller import PipelineController
from airflow_kafka_backpressure.control.cost_mode import CostParams, PlanInputs
from airflow_kafka_backpressure.control.modes import ControlMode, FinishedBatch, PlanDecision
from airflow_kafka_backpressure.control.scaling import ScalingDecision, ScalingPolicy


class SteadyMode(ControlMode):
    """Plans the mean rate of the batches it saw; asks for batches of at least 10 records."""

    name: ClassVar[str] = "steady"
    settings_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, seen: list[tuple[int, int]]) -> None:
        self.seen = seen

    @classmethod
    def create(cls, settings: Any, batch_interval_ms: int) -> SteadyMode:
        return cls([])

    @classmethod
    def from_state(cls, state: Any, settings: Any, batch_interval_ms: int, where: str) -> SteadyMode:
        return cls([tuple(x) for x in state["seen"]])

    def to_dict(self, params: Any = None, batch_interval_s: Any = None) -> dict[str, Any]:
        return {"seen": [list(x) for x in self.seen]}

    def observe(self, batch: FinishedBatch, params: CostParams, *, active: bool) -> int:
        self.seen.append((batch.records, batch.processing_ms))
        return len(self.seen)

    def plan(self, params: CostParams, inputs: PlanInputs) -> PlanDecision:
        records = sum(n for n, _ in self.seen)
        seconds = sum(ms for _, ms in self.seen) / 1000
        return PlanDecision(self.name, records / seconds if seconds else -1.0)

    def suggest_executors(self, current, batches, batch_interval_ms, params, policy, batches_since_change):  # type: ignore[no-untyped-def]
        return ScalingDecision(current, "hold", None, "steady holds")

    def min_records(self, settings: Any, executors: int) -> int | None:
        return 10

    def report(self, observed: Any) -> dict[str, Any]:
        return {"steady_batches": observed}


@pytest.fixture
def steady_registered():
    modes.register(SteadyMode)
    try:
        yield
    finally:
        modes.REGISTRY.pop(SteadyMode.name)


def test_a_registered_mode_is_settable_fed_kept_and_plans(steady_registered):
    settings = parse_settings({"mode": "steady"})  # the settings' choices read the registry
    c = PipelineController.new(settings.mode, settings, 60_000)
    assert set(c.modes) == {"spark", "cost", "steady"}
    feedback = c.on_batch_completed(
        batch_id=1, time_ms=1, records=600, processing_ms=3_000, scheduling_delay_ms=0
    )
    report = c.report(feedback)
    assert (
        report["steady_batches"] == 1 and "rate_limit" in report and "cost" in report
    )  # every mode's figures
    d = json.loads(json.dumps(c.to_dict(settings.cost_params(), 60.0)))
    assert d["steady"] == {"seen": [[600, 3000]]} and d["mode"] == "steady"
    again = PipelineController.from_dict(d, "steady", settings, 60_000)
    assert again.plan(settings.cost_params(), PlanInputs(lag=1_000, batch_interval_s=60.0)).rate == 200.0
    assert again.min_records(settings, 1) == 10  # the plan task's question goes to the active mode
    policy = ScalingPolicy()
    assert (
        again.suggest_executors(2, [], 60_000, settings.cost_params(), policy, None).reason == "steady holds"
    )


def test_an_unregistered_mode_is_refused_by_the_settings():
    from airflow_kafka_backpressure.config.settings import SettingsError

    with pytest.raises(SettingsError, match="'mode'"):
        parse_settings({"mode": "steady"})


def test_each_mode_gives_the_pages_cards_from_its_part_of_the_stored_state():
    """The monitoring page asks the active mode for its cards (plugins/views.mode_cards): no mode is
    named there; a state of the last release's layout (the PID's part at the top) shows too."""
    from airflow_kafka_backpressure.plugins.views import mode_cards

    spark_new = {"mode": "spark", "spark": {"rate_limit": 1234}, "cost": {}}
    spark_old = {"mode": "spark", "rate_limit": -1, "estimator": {}, "cost": {}}
    assert mode_cards(spark_new) == [
        {
            "title": "Rate limit now (spark mode)",
            "value": "1,234 /s",
            "detail": "controller_state.spark.rate_limit",
        }
    ]
    assert mode_cards(spark_old)[0]["value"] == "none"  # -1: no estimate yet
    no_plan = mode_cards({"mode": "cost", "cost": {}, "last_plan": {"mode": "spark", "rate": 5.0}})
    assert no_plan == [
        {
            "title": "Batch budget (cost mode)",
            "value": "\u2013",
            "detail": "no batch planned in this mode yet",
        }
    ]
    assert mode_cards({"mode": "fast"}) == [] and mode_cards(None) == []
