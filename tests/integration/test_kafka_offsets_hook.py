"""KafkaOffsetsHook against the real embedded broker: offsets equal what the test produced."""

from __future__ import annotations

import json
import re

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.kafka.config import KafkaConfigError
from airflow_kafka_backpressure.kafka.offsets import KafkaUnavailableError, TopicNotFoundError
from kbp_local.process import free_port
from kbp_local.producer import ensure_topic, produce
from tests.faults.harness import wait_for


def _connection(monkeypatch, conn_id: str, extra: dict, **fields) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra, **fields})
    )
    return conn_id


def _hook(conn_id: str, timeout_s: float = 5.0):
    from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook

    return KafkaOffsetsHook(conn_id, timeout_s=timeout_s)


def test_offsets_and_group_positions_match_what_was_produced(kafka_broker, topic_name, monkeypatch):
    conn_id = _connection(monkeypatch, "kafka_hooktest", {"bootstrap.servers": kafka_broker.bootstrap})
    ensure_topic(kafka_broker.bootstrap, topic_name, 4)
    produce(kafka_broker.bootstrap, topic_name, count=103, partitions=4)  # ids i -> partition i % 4
    expected_latest = {TopicPartition(topic_name, p): len(range(p, 103, 4)) for p in range(4)}

    with _hook(conn_id).get_conn() as kafka:
        tps = kafka.partitions([topic_name])
        assert tps == sorted(expected_latest)
        assert kafka.earliest_offsets(tps) == dict.fromkeys(tps, 0)
        assert kafka.latest_offsets(tps) == expected_latest

        group = f"{topic_name}-group"
        assert kafka.committed_offsets(group, tps) == {}
        assert kafka.lag(group, [topic_name]) == expected_latest
        kafka.commit_offsets(group, {tps[0]: 10, tps[1]: 26})
        assert kafka.committed_offsets(group, tps) == {tps[0]: 10, tps[1]: 26}
        lag = kafka.lag(group, [topic_name])
        assert lag[tps[0]] == expected_latest[tps[0]] - 10
        assert lag[tps[1]] == 0
        assert lag[tps[2]] == expected_latest[tps[2]]


def test_host_and_port_are_used_without_bootstrap_servers(kafka_broker, topic_name, monkeypatch):
    host, port = kafka_broker.bootstrap.split(":")
    conn_id = _connection(monkeypatch, "kafka_hostport", {}, host=host, port=int(port))
    ensure_topic(kafka_broker.bootstrap, topic_name, 1)
    with _hook(conn_id).get_conn() as kafka:
        assert kafka.partitions([topic_name]) == [TopicPartition(topic_name, 0)]


def test_missing_topic_is_a_clear_error(kafka_broker, monkeypatch):
    conn_id = _connection(monkeypatch, "kafka_missing", {"bootstrap.servers": kafka_broker.bootstrap})
    with (
        _hook(conn_id).get_conn() as kafka,
        pytest.raises(TopicNotFoundError, match=r"\['no-such-topic'\] do not exist"),
    ):
        kafka.partitions(["no-such-topic"])


def test_offsets_of_a_deleted_topic_say_the_topic_is_gone_not_the_broker(
    kafka_broker, topic_name, monkeypatch
):
    """A topic deleted after a batch was planned (a replay asks for its earliest offsets): the error
    names the topic, not a broker that is "down, frozen or unreachable" (issue 21, item 7)."""
    from kafka import KafkaAdminClient

    conn_id = _connection(monkeypatch, "kafka_deleted", {"bootstrap.servers": kafka_broker.bootstrap})
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=10, partitions=2)
    tps = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
    # This test failed once beside a second pytest (load average 11) with "DID NOT RAISE": the
    # broker still served the deleted topic's offsets. DeleteTopics answers once the controller has
    # the deletion and the broker applies it a moment later (Kafka updates the broker's metadata
    # before its partitions): until then returning offsets is right. So the test waits for the
    # cluster's topic list to drop the topic, and then asks each query until it stops answering;
    # its first error must name the topic. 15 s, not 5: the query waits out its timeout for the gone
    # partitions, then asks through a new admin client which topics exist; when that cannot answer
    # in time the product rightly says it cannot tell, and blames the broker.
    with _hook(conn_id, timeout_s=15.0).get_conn() as kafka:
        assert kafka.earliest_offsets(tps) == dict.fromkeys(tps, 0)  # the client knows the topic
        admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
        try:
            admin.delete_topics([topic_name])
            wait_for(
                f"the topic list to drop {topic_name}",
                lambda: topic_name not in admin.list_topics(),
                60,
                every_s=0.2,
                transient=(),
            )
        finally:
            admin.close()
        for query in (kafka.earliest_offsets, kafka.latest_offsets):
            error = wait_for(
                f"{query.__name__} to stop answering for the deleted topic",
                lambda q=query: _error_of(q, tps),
                60,
                every_s=0.2,
                transient=(),
            )
            assert isinstance(error, TopicNotFoundError), repr(error)
            assert re.search(rf"{topic_name}.*no longer exist", str(error)), str(error)
            assert "down, frozen or unreachable" not in str(error)
    # Asking must not create the topic again (CI, 2026-12-02: kafka-python 3.0's metadata requests
    # allowed auto-creation whatever the consumer said, and the broker, as Kafka's default has it,
    # created the topic again with one partition: the next query found partition 1 missing from a
    # topic that existed). A fresh client, as a new task or a client discarded after a timeout has,
    # asks the topic's metadata anew: the error names the topic, and the topic stays deleted.
    with _hook(conn_id, timeout_s=5.0).get_conn() as kafka:
        error = _error_of(kafka.latest_offsets, tps)
    assert isinstance(error, TopicNotFoundError), repr(error)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert topic_name not in admin.list_topics(), "asking the offsets of a deleted topic created it again"
    finally:
        admin.close()


def _error_of(query, tps) -> Exception | None:
    """What ``query(tps)`` raised; None while it still answers (the deletion not yet applied)."""
    try:
        query(tps)
    except Exception as e:  # noqa: BLE001 - handed to the test's assertions
        return e
    return None


def test_unreachable_broker_is_a_clear_error_not_a_hang(monkeypatch):
    dead = f"127.0.0.1:{free_port()}"
    conn_id = _connection(monkeypatch, "kafka_dead", {"bootstrap.servers": dead, "sasl.password": "s3cret"})
    with pytest.raises(KafkaUnavailableError) as e:
        with _hook(conn_id, timeout_s=2).get_conn() as kafka:
            kafka.partitions(["t"])
    msg = str(e.value)
    assert "kafka_dead" in msg and dead in msg and "reachable" in msg
    assert "s3cret" not in msg  # secrets are redacted


def test_unknown_property_is_refused_with_the_key(monkeypatch):
    conn_id = _connection(monkeypatch, "kafka_badkey", {"bootstrap.servers": "x:1", "sasl.pasword": "x"})
    with pytest.raises(KafkaConfigError, match="sasl.pasword"):
        _hook(conn_id).get_conn()


def test_test_connection_reports_success_and_failure(kafka_broker, monkeypatch):
    ok = _connection(monkeypatch, "kafka_ok", {"bootstrap.servers": kafka_broker.bootstrap})
    assert _hook(ok).test_connection()[0] is True
    bad = _connection(monkeypatch, "kafka_bad", {"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    status, message = _hook(bad, timeout_s=1).test_connection()
    assert status is False and "no Kafka broker answered" in message
