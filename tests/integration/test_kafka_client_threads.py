"""A failed connection leaves nothing running: kafka-python 3 starts a client's network thread before
it bootstraps, and a constructor that fails (nothing listens at the address) used to leave that
thread reconnecting for the life of the process — one more per attempt, so a triggerer or a readiness
probe polling a down broker gathered threads without end. Real clients against a real closed port."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets, KafkaUnavailableError
from kbp_local.broker import metadata_ok
from kbp_local.process import free_port
from kbp_local.producer import ensure_topic, produce

ATTEMPTS = 3


def kafka_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kafka-io") and t.is_alive()]


def settled_kafka_threads(before: int, wait_s: float = 10.0) -> int:
    """The number of kafka-python network threads once closing clients had time to end theirs."""
    deadline = time.monotonic() + wait_s
    while len(kafka_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(kafka_threads())


@pytest.fixture
def down_broker() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there


def test_offset_queries_against_a_down_broker_leave_no_client_thread(down_broker):
    before = len(kafka_threads())
    for _ in range(ATTEMPTS):
        with pytest.raises(KafkaUnavailableError, match=down_broker):
            with KafkaOffsets({"bootstrap.servers": down_broker}, timeout_s=1) as kafka:
                kafka.latest_offsets([TopicPartition("t", 0)])
    assert settled_kafka_threads(before) == before, [t.name for t in kafka_threads()]


def test_probes_and_producers_against_a_down_broker_leave_no_client_thread(down_broker):
    before = len(kafka_threads())
    for _ in range(ATTEMPTS):
        assert not metadata_ok(down_broker, timeout_s=1)
        with pytest.raises(Exception):  # noqa: B017 - any client error; this test counts threads
            ensure_topic(down_broker, "t", 1, client_config={"bootstrap_timeout_ms": 1000})
        with pytest.raises(Exception):  # noqa: B017 - any client error; this test counts threads
            produce(down_broker, "t", count=1, partitions=1, client_config={"bootstrap_timeout_ms": 1000})
    assert settled_kafka_threads(before) == before, [t.name for t in kafka_threads()]
