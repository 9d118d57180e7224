"""The plan, record and scale tasks in the cost mode (the default), under real Airflow
(``dag.test``), the real broker, real Spark and a SQLite ledger: the plan's rate is the cost
model's budget for exactly what the plan task saw, the state Variable keeps both models, and a
broken state fails the plan before anything is planned."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.batch.models import BatchMetrics
from airflow_kafka_backpressure.config.settings import parse_settings
from airflow_kafka_backpressure.control.controller import PipelineController
from airflow_kafka_backpressure.control.cost_mode import PlanInputs, arrival_rate
from kbp_local.producer import produce

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
    controller = PipelineController.from_dict(state1, "cost", settings, p.batch_interval_ms)
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
    # what planned, for the page: the cost mode's budget and regime, not the PID's rate limit
    assert state2["last_plan"]["mode"] == "cost" and state2["last_plan"]["regime"] == "keep-up"
    assert (
        state2["last_plan"]["rate"] == pytest.approx(plan2["rate"]) and state2["last_plan"]["batch_id"] == 2
    )
    assert [o[0] for o in state2["cost"]["observations"]] == [1, 2]
    # each observation carries its batch's measured start-up (launch to the first record read),
    # which the model counts as fixed cost: the job's metrics, as the ingest task pushed them
    for run, observation in zip((first, second), state2["cost"]["observations"], strict=True):
        metrics = BatchMetrics.from_dict(run.xcoms["ingest"])
        assert 0 < metrics.startup_ms < metrics.processing_ms
        assert observation[4] == metrics.startup_ms
    assert state2["cost"]["fit"]["fixed_s"] >= 0 and state2["cost"]["target_ratio"] == 0.75
    assert "warning" in state2["cost"]
    # the PID is fed too, as Spark would be
    assert state2["spark"]["estimator"]["state"]["first_run"] is False
    assert second.xcoms["scale"]["action"] in ("up", "down", "hold") and second.xcoms["scale"]["reason"]


def test_a_state_with_nan_fails_the_plan_naming_the_variable(make_pipeline, kafka_broker):
    p, ledger = make_pipeline()
    produce(kafka_broker.bootstrap, p.topics[0], count=40, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"
    state = af.variable(p.controller_variable)
    state["spark"]["estimator"]["state"]["latest_rate"] = float("nan")
    af.set_variable(p.controller_variable, json.dumps(state))  # json writes NaN, as a hand edit could

    bad = af.run_dag(p.ingest_dag_id, 1)
    assert bad.task_states["plan"] == "failed"
    assert ledger.get_plan(p.name, bad.run_id) is None and len(ledger.recent_batches(p.name)) == 1


def sink_events(p) -> list[str]:
    """Partition keys (batch ids) of the pipeline's sink Asset events."""
    return [key for key, _ in af.sink_asset_events(p)]


def test_runs_below_min_records_skip_their_batch_until_max_batch_delay_has_passed(
    make_pipeline, kafka_broker
):
    """Issue 23 item 3: a run with less than min_records_per_batch skips (no plan, no Spark job, no
    commit, no Asset event; the state says "waiting for data") until max_batch_delay_s has passed
    since the last batch's plan; then it reads whatever there is."""
    import time

    from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets

    p, ledger = make_pipeline()
    topic = p.topics[0]
    af.set_variable(
        p.settings_variable, json.dumps({"min_records_per_batch": 100, "max_batch_delay_s": 3600})
    )
    produce(kafka_broker.bootstrap, topic, count=150, partitions=4)
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success" and first.xcoms["ingest"]["records"] == 150

    produce(kafka_broker.bootstrap, topic, count=20, partitions=4, start_id=150)
    waiting = af.run_dag(p.ingest_dag_id, 1)
    assert waiting.task_states == {
        "plan": "skipped",
        "ingest": "skipped",
        "record": "skipped",
        "scale": "skipped",
    }
    assert ledger.get_plan(p.name, waiting.run_id) is None and len(ledger.recent_batches(p.name)) == 1
    state = af.variable(p.controller_variable)["waiting"]
    assert (state["available"], state["min_records"]) == (20, 100)
    assert sink_events(p) == ["1"]  # no event for the skipped run
    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as k:
        assert sum(k.committed_offsets(p.group, k.partitions([topic])).values()) == 150  # nothing committed

    # the delay has passed (1 s since batch 1's plan, its Spark job and the skipped run in between)
    af.set_variable(p.settings_variable, json.dumps({"min_records_per_batch": 100, "max_batch_delay_s": 1}))
    time.sleep(1.0)  # so it has passed whatever the clock's resolution; nothing is asserted on time
    late = af.run_dag(p.ingest_dag_id, 2)
    assert late.state == "success", late.task_states
    assert late.xcoms["ingest"]["records"] == 20 and ledger.batch(2).status == "succeeded"
    assert af.variable(p.controller_variable)["waiting"] is None
    assert sink_events(p) == ["1", "2"]


def test_a_gain_edited_in_the_settings_variable_changes_the_next_plan_in_the_cost_mode(
    make_pipeline, kafka_broker
):
    """Issue 23: in the default (cost) mode the gains are the correction's; editing one in the
    settings Variable changes the next plan. The state is what the record task writes after batches
    of 1,000-3,000 records at 10 ms each (±5%) that each left a backlog behind; with it and a
    backlog of 20,000 records, the plan is in the drain regime where the correction counts."""
    import random

    p, ledger = make_pipeline()
    settings = parse_settings("{}")
    controller = PipelineController.new("cost", settings, p.batch_interval_ms)
    rng = random.Random(5)
    for i, n in enumerate([1_000, 3_000, 2_000, 3_000, 1_500, 2_500]):
        ms = int((2.0 + n * 0.010 * (1 + rng.uniform(-0.05, 0.05))) * 1000)
        controller.on_batch_completed(
            batch_id=i + 1,
            time_ms=(i + 1) * 60_000,
            records=n,
            processing_ms=ms,
            scheduling_delay_ms=0,
            params=settings.cost_params(),
            left_behind=10_000,
            budget=float(n),
            batch_interval_s=p.batch_interval_s,
        )
    state = controller.to_dict(settings.cost_params(), p.batch_interval_s)
    assert state["cost"]["correction"]["terms"]["output"] > 0
    af.set_variable(p.controller_variable, json.dumps(state))
    produce(kafka_broker.bootstrap, p.topics[0], count=20_000, partitions=4)

    edited = parse_settings('{"proportional": 0, "integral": 0}')  # the correction off
    af.set_variable(p.settings_variable, edited.to_json())
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.state == "success", r.task_states

    def planned(s):
        c = PipelineController.from_dict(state, "cost", s, p.batch_interval_ms)
        inputs = PlanInputs(lag=20_000, batch_interval_s=p.batch_interval_s, executors=s.initial_executors)
        return c.plan(s.cost_params(), inputs)

    with_gains, without = planned(settings), planned(edited)
    assert without.budget.regime == with_gains.budget.regime == "drain"
    assert without.budget.correction == 0 < with_gains.budget.correction
    assert r.xcoms["plan"]["rate"] == pytest.approx(without.rate) and without.rate < with_gains.rate
    # the budget split over 4 partitions (whole records each)
    assert without.budget.records - 4 <= r.xcoms["ingest"]["records"] <= without.budget.records < 20_000
