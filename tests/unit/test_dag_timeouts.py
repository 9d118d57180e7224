"""Every task the DAG factory builds has an ``execution_timeout`` derived from the pipeline's batch
interval and timeouts, and each is settable through the pipelines file."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.dag_factory import REPLAY_BATCHES_PER_RUN, build_dags


def timeouts(**kw) -> dict[tuple[str, str], timedelta | None]:
    p = PipelineConfig(name="orders", topics=("orders",), sink="/data/orders", **kw)
    return {
        (dag_id.split("_")[1], task.task_id): task.execution_timeout
        for dag_id, dag in build_dags([p]).items()
        for task in dag.tasks
    }


def test_every_task_of_both_dags_has_an_execution_timeout():
    t = timeouts()
    assert set(t) == {("ingest", x) for x in ("plan", "ingest", "record", "scale")} | {
        ("replay", "failed_ranges"),
        ("replay", "replay"),
        ("replay", "check"),
    }
    assert all(isinstance(v, timedelta) and v > timedelta(0) for v in t.values()), t


def test_defaults_follow_the_batch_interval():
    minute = timeouts(batch_interval_s=60)
    # control tasks: 2 intervals, but at least 10 broker calls at kafka_timeout_s (30 s)
    assert (
        minute[("ingest", "plan")]
        == minute[("ingest", "record")]
        == minute[("ingest", "scale")]
        == timedelta(seconds=300)
    )
    # the batch: its own timeout (max(5 intervals, 600 s)) + the control bound
    assert minute[("ingest", "ingest")] == timedelta(seconds=600 + 300)
    hourly = timeouts(batch_interval_s=3600)
    assert hourly[("ingest", "plan")] == timedelta(seconds=7200)
    assert hourly[("ingest", "ingest")] == timedelta(seconds=5 * 3600 + 7200)
    # the replay sensor waits one replay interval (default 5 batch intervals)
    assert hourly[("replay", "failed_ranges")] == timedelta(seconds=5 * 3600 + 7200)


@pytest.mark.parametrize(
    "kw, task, expected",
    [
        ({"task_timeout_s": 45}, ("ingest", "plan"), 45),
        ({"task_timeout_s": 45}, ("ingest", "ingest"), 600 + 45),
        ({"batch_timeout_s": 120, "stall_timeout_s": 30}, ("ingest", "ingest"), 120 + 300),
        ({"kafka_timeout_s": 60}, ("ingest", "record"), 600),
        ({"replay_interval_s": 30, "task_timeout_s": 20}, ("replay", "failed_ranges"), 50),
        (
            {"batch_timeout_s": 100, "stall_timeout_s": 30, "task_timeout_s": 20},
            ("replay", "replay"),
            REPLAY_BATCHES_PER_RUN * 120 + 20,
        ),
    ],
)
def test_timeouts_are_settable(kw, task, expected):
    assert timeouts(**kw)[task] == timedelta(seconds=expected)


def test_one_replay_run_is_bounded_in_batches():
    p = PipelineConfig(name="orders", topics=("orders",), sink="/data/orders")
    replay = build_dags([p])[p.replay_dag_id].get_task("replay")
    assert replay.max_batches == REPLAY_BATCHES_PER_RUN
