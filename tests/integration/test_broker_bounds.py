"""Every broker call of the plan, record, replay and sensor paths is bounded: against a real broker
frozen with SIGSTOP (connections open, nothing answers) each call fails with a clear error naming the
broker and the fix instead of waiting for ever — kafka-python's ``committed()`` alone retries for
ever while the group coordinator does not answer."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange, TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets, KafkaUnavailableError
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.operators.common import commit_progress
from kbp_local.apache_kafka import KafkaBroker
from kbp_local.producer import ensure_topic, produce

TIMEOUT_S = 2.0
#: How long the test waits for a call to come back before calling it hung. Far above the bound
#: (timeout + watchdog grace): this checks that the call ends, not how fast.
HUNG_AFTER_S = 90.0
TOPIC = "frozen"
GROUP = "frozen-group"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def frozen_broker(tmp_path) -> Iterator[KafkaBroker]:
    """A broker of this test alone (it gets frozen), with a topic and a committed group offset."""
    broker = KafkaBroker(tmp_path / "kafka").start()
    try:
        ensure_topic(broker.bootstrap, TOPIC, 2)
        produce(broker.bootstrap, TOPIC, count=10, partitions=2)
        with KafkaOffsets({"bootstrap.servers": broker.bootstrap}, timeout_s=10) as kafka:
            kafka.commit_offsets(GROUP, {TP: 3})
        yield broker
    finally:
        if broker.pid:
            os.kill(broker.pid, signal.SIGCONT)
        broker.stop()


def outcome(call: Callable[[], Any]) -> BaseException | str:
    """What ``call`` raised, ``"returned"``, or ``"hung"`` if it had not come back after HUNG_AFTER_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            call()
            box["r"] = "returned"
        except BaseException as e:  # noqa: BLE001
            box["r"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HUNG_AFTER_S)
    return box.get("r", "hung")


def warm_client(broker: KafkaBroker) -> KafkaOffsets:
    """A client that bootstrapped and found the group coordinator while the broker was up."""
    kafka = KafkaOffsets(
        {"bootstrap.servers": broker.bootstrap}, source="Kafka connection 'frozen'", timeout_s=TIMEOUT_S
    )
    assert kafka.partitions([TOPIC]) == [TP, TopicPartition(TOPIC, 1)]
    assert kafka.committed_offsets(GROUP, [TP]) == {TP: 3}
    return kafka


CALLS: dict[str, Callable[[KafkaOffsets], Any]] = {
    "committed": lambda k: k.committed_offsets(GROUP, [TP]),
    "commit": lambda k: k.commit_offsets(GROUP, {TP: 4}),
    "earliest": lambda k: k.earliest_offsets([TP]),
    "latest": lambda k: k.latest_offsets([TP]),
    "metadata": lambda k: k.partitions([TOPIC, "not-cached-yet"]),
    "topics": lambda k: k.topics(),
    "committed (new group)": lambda k: k.committed_offsets("another-group", [TP]),
}


def test_every_broker_call_fails_clearly_when_the_broker_is_frozen(frozen_broker):
    clients = {name: warm_client(frozen_broker) for name in CALLS}
    os.kill(frozen_broker.pid, signal.SIGSTOP)
    try:
        results = {name: outcome(lambda n=name: CALLS[n](clients[n])) for name in CALLS}
    finally:
        os.kill(frozen_broker.pid, signal.SIGCONT)
        for kafka in clients.values():  # their network threads would retry the stopped broker for ever
            kafka.close()
    for name, result in results.items():
        assert isinstance(result, KafkaUnavailableError), (name, result)
        message = str(result)
        assert "Kafka connection 'frozen'" in message and frozen_broker.bootstrap in message, (name, message)
        assert "kafka_timeout_s" in message and "reachable" in message, (name, message)


def test_commit_progress_of_record_and_replay_fails_clearly_when_the_broker_is_frozen(
    frozen_broker, tmp_path
):
    p = PipelineConfig(name="frozen", topics=(TOPIC,), sink=str(tmp_path / "sink"), kafka_timeout_s=TIMEOUT_S)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_all()
    batch = ledger.record_plan(p.name, "run1", [OffsetRange(TOPIC, 0, 0, 5)], p.sink, 1000, 0).batch_id
    ledger.mark_running(batch)
    ledger.mark_succeeded(batch, 5, 1)
    kafka = warm_client(frozen_broker)
    os.kill(frozen_broker.pid, signal.SIGSTOP)
    result = outcome(lambda: commit_progress(p, ledger, kafka))
    assert isinstance(result, KafkaUnavailableError), result
    assert "group 'kbp-frozen'" in str(result) and frozen_broker.bootstrap in str(result)
    # the broker comes back: the same pipeline commits (the stuck client was discarded)
    os.kill(frozen_broker.pid, signal.SIGCONT)
    kafka.close()
    with KafkaOffsets({"bootstrap.servers": frozen_broker.bootstrap}, timeout_s=10) as fresh:
        assert commit_progress(p, ledger, fresh) == {str(TP): 5}
