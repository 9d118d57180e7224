"""The payloads the ingest DAG's tasks pass by XCom (the plan task's :class:`BatchPlan`, the ingest
task's :class:`BatchMetrics`) are parsed one way — the JSON-safe dict ``to_xcom()`` pushed — and a
malformed one fails with a message naming the task and the XCom key. The record task pulls the
ingest task's XCom itself (no Jinja template, which rendered the dict as its repr)."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.batch.models import (
    BatchMetrics,
    BatchPlan,
    DataLoss,
    OffsetRange,
    PartitionCount,
    XComPayloadError,
)
from airflow_kafka_backpressure.operators import RecordBatchMetricsOperator

METRICS = BatchMetrics(7, 120, 4096, 1_000, 2_000, 5_000, 2, (PartitionCount("orders", 0, 120),))
PLAN = BatchPlan(
    "orders",
    7,
    "scheduled__1",
    (OffsetRange("orders", 0, 10, 130),),
    "/data/orders",
    60_000,
    1_000,
    rate=2.0,
    data_loss=(DataLoss("orders", 0, 0, 10),),
    lag=5,
    topic_ids={"orders": "abc"},
)


def test_payloads_round_trip_through_their_json_xcom():
    for payload in (METRICS, PLAN):
        pushed = json.loads(json.dumps(payload.to_xcom()))  # what an XCom backend stores
        assert type(payload).from_xcom(pushed, task_id="t") == payload
    assert isinstance(BatchPlan.from_xcom(PLAN.to_xcom(), task_id="plan").data_loss[0], DataLoss)


@pytest.mark.parametrize(
    "value, says",
    [
        (None, "is missing"),
        (str(METRICS.to_xcom()), "expected a dict, got str \"{'batch_id': 7"),  # a rendered template
        ({k: v for k, v in METRICS.to_xcom().items() if k != "records"}, "no field 'records'"),
        ({**METRICS.to_xcom(), "records": "many"}, "ValueError: invalid literal for int()"),
    ],
)
def test_a_malformed_metrics_payload_names_the_task_and_key(value, says):
    with pytest.raises(XComPayloadError) as e:
        BatchMetrics.from_xcom(value, task_id="ingest")
    assert "XCom 'return_value' of task 'ingest' " in str(e.value) and says in str(e.value)


def test_a_malformed_plan_payload_names_the_task_and_key():
    with pytest.raises(
        XComPayloadError, match="XCom 'plan' of task 'planner' is not a batch plan: no field 'batch_id'"
    ):
        BatchPlan.from_xcom({"pipeline": "orders"}, task_id="planner", key="plan")


class _TaskInstance:
    def __init__(self, xcoms: dict[tuple[str, str], object]):
        self.xcoms = xcoms

    def xcom_pull(self, *, task_ids: str, key: str) -> object:
        return self.xcoms.get((task_ids, key))


def _record(**kw) -> RecordBatchMetricsOperator:
    pipeline = {"name": "orders", "topics": ["orders"], "sink": "/data/orders"}
    return RecordBatchMetricsOperator(task_id="record", pipeline=pipeline, **kw)


def test_the_record_task_pulls_the_ingest_tasks_metrics():
    ti = _TaskInstance({("ingest", "return_value"): METRICS.to_xcom()})
    assert _record()._metrics({"ti": ti}) == METRICS
    ti = _TaskInstance({("spark", "return_value"): METRICS.to_xcom()})
    assert _record(ingest_task_id="spark")._metrics({"ti": ti}) == METRICS
    with pytest.raises(XComPayloadError, match="XCom 'return_value' of task 'ingest' is missing"):
        _record()._metrics({"ti": _TaskInstance({})})


def test_the_record_task_takes_metrics_given_directly_but_no_template_string():
    assert _record(metrics=METRICS.to_xcom())._metrics({}) == METRICS
    with pytest.raises(TypeError, match="not a string"):
        _record(metrics="{{ ti.xcom_pull(task_ids='ingest') }}")


def test_the_start_up_is_launch_to_the_read_within_the_processing_time():
    from dataclasses import replace

    assert (METRICS.processing_ms, METRICS.startup_ms) == (4_000, 1_000)
    assert replace(METRICS, read_started_at_ms=500).startup_ms == 0  # clocks of two hosts: never negative
    assert replace(METRICS, read_started_at_ms=9_000).startup_ms == 4_000  # never beyond the whole
