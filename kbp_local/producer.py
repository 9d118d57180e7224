"""Demo data: keyed JSON records with unique, consecutive ids, produced in record batches as a
real producer sends them (the client's ``linger.ms`` and ``batch.size``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from airflow_kafka_backpressure.kafka.clients import new_client


class ProduceError(RuntimeError):
    """Records of the demo producer that Kafka did not acknowledge."""


def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    client_config: dict[str, Any] | None = None,
    replication_factor: int = 1,
) -> bool:
    """Create ``topic`` with ``partitions`` partitions and ``replication_factor`` replicas (-1: the
    brokers' ``default.replication.factor``) unless it exists. True when it was created."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = new_client(
        KafkaAdminClient, bootstrap_servers=bootstrap, client_id="kbp-demo-admin", **(client_config or {})
    )
    try:
        if topic in admin.list_topics():
            return False
        try:
            admin.create_topics(
                [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)]
            )
        except TopicAlreadyExistsError:
            return False
        return True
    finally:
        admin.close()


def demo_record(record_id: int, payload_bytes: int = 64) -> tuple[bytes, bytes]:
    key = f"k{record_id}".encode()
    value = json.dumps(
        {"id": record_id, "produced_at_ms": int(time.time() * 1000), "payload": "x" * payload_bytes},
        separators=(",", ":"),
    ).encode()
    return key, value


def _ids(start_id: int, count: int | None) -> Iterator[int]:
    i = start_id
    while count is None or i < start_id + count:
        yield i
        i += 1


def produce(
    bootstrap: str,
    topic: str,
    *,
    count: int | None,
    partitions: int = 4,
    start_id: int = 0,
    rate: float | None = None,
    payload_bytes: int = 64,
    client_config: dict[str, Any] | None = None,
    stop: Any = None,
) -> int:
    """Produce ``count`` records (until ``stop`` is set when None) with ids from ``start_id``; id
    ``i`` goes to partition ``i % partitions``. ``rate`` caps records per second. Returns the
    number sent, every one of them acknowledged by the brokers (``acks=all``, idempotent); raises
    :class:`ProduceError` when one was not (its delivery timed out, say), so that the count a
    caller prints is never more than what Kafka holds."""
    from kafka import KafkaProducer

    producer = new_client(
        KafkaProducer,
        bootstrap_servers=bootstrap,
        linger_ms=5,
        acks="all",
        client_id="kbp-demo-producer",
        **(client_config or {}),
    )
    sent = 0
    failures: list[BaseException] = []
    started = time.monotonic()
    try:
        for record_id in _ids(start_id, count):
            if stop is not None and stop.is_set():
                break
            key, value = demo_record(record_id, payload_bytes)
            producer.send(topic, key=key, value=value, partition=record_id % partitions).add_errback(
                failures.append
            )
            sent += 1
            if rate:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    producer.flush()
                    time.sleep(ahead)
            if failures:
                break
        producer.flush()
    finally:
        producer.close()
    if failures:
        raise ProduceError(
            f"{len(failures)} of {sent} records to {topic} were not acknowledged by Kafka at {bootstrap} "
            f"(first: {type(failures[0]).__name__}: {failures[0]})"
        )
    return sent
