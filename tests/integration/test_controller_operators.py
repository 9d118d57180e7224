"""The plan, record and scale tasks in the cost mode (the default), under real Airflow
(``dag.test``), the real broker, real Spark and a SQLite ledger: the plan's rate is the cost
model's budget for exactly what the plan task saw, the state Variable keeps both models, and a
broken state fails the plan before anything is planned."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.config import parse_settings
from airflow_kafka_backpressure.control.controller import PipelineController
from airflow_kafka_backpressure.control.cost_mode import PlanInputs, arrival_rate
from airflow_kafka_backpressure.local.producer import produce

from . import airflow_harness as af


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def make_pipeline(kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db):
    return af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)


def latest_total(plan: dict) -> int:
    return sum(r["until_offset"] for r in plan["ranges"]) + plan["lag"]


def test_the_cost_mode_plans_from_the_cost_model_and_keeps_both_models(make_pipeline, kafka_broker):
    p, ledger = make_pipeline()
    topic = p.topics[0]
    produce(kafka_broker.bootstrap, topic, count=300, partitions=4)
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success", first.task_states
    settings = parse_settings(json.dumps(af.variable(p.settings_variable)))
    assert settings.mode == "cost"  # created with the defaults
    state1 = af.variable(p.controller_variable)
    assert state1["mode"] == "cost" and len(state1["cost"]["observations"]) == 1
    assert first.xcoms["record"]["mode"] == "cost" and first.xcoms["record"]["cost"] is not None

    produce(kafka_broker.bootstrap, topic, count=200, partitions=4, start_id=300)
    second = af.run_dag(p.ingest_dag_id, 1)
    assert second.state == "success", second.task_states
    plan1, plan2 = first.xcoms["plan"], second.xcoms["plan"]

    # what the plan task saw: the lag before it planned, the arrivals since the last plan
    executors = af.variable(p.executors_variable)["executors"]  # the scale task's target after run 1
    controller = PipelineController.from_dict(state1, "cost", settings.estimator(p.batch_interval_ms))
    expected = controller.plan(
        settings.cost_params(),
        PlanInputs(
            lag=sum(r["until_offset"] - r["from_offset"] for r in plan2["ranges"]) + plan2["lag"],
            batch_interval_s=p.batch_interval_s,
            executors=executors,
            arrivals_per_s=arrival_rate(
                [(plan1["planned_at_ms"], latest_total(plan1)), (plan2["planned_at_ms"], latest_total(plan2))]
            ),
            previous_budget=int(plan1["rate"] * p.batch_interval_s) if plan1["rate"] else None,
            draining=plan1["lag"] > 0,
        ),
    )
    assert expected.budget is not None and expected.budget.regime == "keep-up"
    assert plan2["rate"] == pytest.approx(expected.rate)
    assert second.xcoms["ingest"]["records"] == 200  # a small batch: all of it fits the target

    state2 = af.variable(p.controller_variable)
    assert [o[0] for o in state2["cost"]["observations"]] == [1, 2]
    assert state2["cost"]["fit"]["fixed_s"] >= 0 and state2["cost"]["target_ratio"] == 0.75
    assert "warning" in state2["cost"]
    # the PID is fed too, as Spark would be
    assert state2["estimator"]["state"]["first_run"] is False
    assert second.xcoms["scale"]["action"] in ("up", "down", "hold") and second.xcoms["scale"]["reason"]


def test_a_state_with_nan_fails_the_plan_naming_the_variable(make_pipeline, kafka_broker):
    p, ledger = make_pipeline()
    produce(kafka_broker.bootstrap, p.topics[0], count=40, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"
    state = af.variable(p.controller_variable)
    state["estimator"]["state"]["latest_rate"] = float("nan")
    af.set_variable(p.controller_variable, json.dumps(state))  # json writes NaN, as a hand edit could

    bad = af.run_dag(p.ingest_dag_id, 1)
    assert bad.task_states["plan"] == "failed"
    assert ledger.get_plan(p.name, bad.run_id) is None and len(ledger.recent_batches(p.name)) == 1
