"""The Spark job's bounds check ends within its limit whatever its Kafka client waits on.

Cause (a fault-suite run on 2026-11-27): with SASL_SSL, a broker frozen right after the job's
bootstrap accepted the next TCP connection (the kernel does, for a stopped process) and never
answered its TLS handshake, which kafka-python does not time out: the bounds check, and so the
batch, waited until the broker came back (6 minutes). The stall is stood in for by a function that
sleeps where the client would wait; the real frozen broker is tests/faults' broker-freeze scenario.
"""

from __future__ import annotations

import time

import pytest

from airflow_kafka_backpressure.batch.models import BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.kafka.clients import NoAnswer, run_within
from airflow_kafka_backpressure.spark import bounds
from airflow_kafka_backpressure.spark.errors import JobError


def spec(**kafka: str) -> JobSpec:
    plan = BatchPlan("orders", 7, "r", (OffsetRange("t", 0, 0, 5),), "/s", 1000, 0)
    return JobSpec(plan=plan, kafka={"bootstrap.servers": "127.0.0.1:9", **kafka}, launched_at_ms=0)


def test_a_client_that_never_answers_fails_the_check_within_its_limit(monkeypatch):
    monkeypatch.setattr(bounds, "_ask_brokers", lambda cfg, ranges: time.sleep(120))
    started = time.monotonic()
    with pytest.raises(
        JobError, match=r"no answer from Kafka at '127.0.0.1:9' within 5 s .* batch 7 of pipeline 'orders'"
    ):
        bounds.check_bounds(
            spec(**{"socket.connection.setup.timeout.ms": "300", "request.timeout.ms": "900"})
        )
    assert time.monotonic() - started < 60  # the limit is 5 s: far from the 120 s stall


def test_run_within_hands_back_the_result_or_the_error():
    assert run_within(5, "quick", lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        run_within(5, "failing", lambda: 1 / 0)
    with pytest.raises(NoAnswer, match="stuck: no answer within 0 s"):
        run_within(0.2, "stuck", lambda: time.sleep(5))


def test_a_started_check_runs_beside_the_caller_and_hands_back_its_answer_or_error(monkeypatch):
    """started_check (the connect engine's: the ranges checked while the client session opens)
    returns at once; the call it returns waits for the check, then gives its answer or raises its error."""
    import threading

    release = threading.Event()
    ran_in: list[str] = []
    released: list[bool] = []

    def asked(cfg, ranges):
        ran_in.append(threading.current_thread().name)
        released.append(release.wait(10))  # False: the caller was kept waiting for the check
        return {"t": {0}}, {_tp("t", 0): 0}, {_tp("t", 0): 2}

    monkeypatch.setattr(bounds, "_ask_brokers", asked)
    answer = bounds.started_check(spec())  # returns while the brokers have not answered
    assert not release.is_set()
    release.set()
    with pytest.raises(JobError, match=r"t-0\[0, 5\).*latest offset 2"):
        answer()
    assert released == [True] and ran_in[0] != threading.current_thread().name

    monkeypatch.setattr(
        bounds, "_ask_brokers", lambda cfg, ranges: ({"t": {0}}, {_tp("t", 0): 0}, {_tp("t", 0): 9})
    )
    assert bounds.started_check(spec())() == {bounds.TopicPartition("t", 0): (0, 9)}


def _tp(topic: str, partition: int):
    from kafka import TopicPartition as KafkaTopicPartition

    return KafkaTopicPartition(topic, partition)
