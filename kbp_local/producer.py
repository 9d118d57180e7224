"""Demo data: keyed JSON records with unique, consecutive ids, produced in record batches as a
real producer sends them (the client's ``linger.ms`` and ``batch.size``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
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


#: The demo's Avro value schemas: version 1, then version 2 with a field added (compatible: it has
#: a default), as a producer deploy changes it midway
DEMO_AVRO_V1 = {
    "type": "record",
    "name": "DemoEvent",
    "namespace": "kbp.demo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "produced_at_ms", "type": "long"},
        {"name": "payload", "type": "string"},
    ],
}
DEMO_AVRO_V2 = {
    **DEMO_AVRO_V1,
    "fields": [*DEMO_AVRO_V1["fields"], {"name": "source", "type": ["null", "string"], "default": None}],
}


def avro_records(
    registry_url: str,
    topic: str,
    *,
    payload_bytes: int = 64,
    schema_change_at: int | None = None,
    corrupt_every: int | None = None,
) -> Callable[[int, int], tuple[bytes, bytes]]:
    """The demo's records with Avro values in Confluent's wire format, encoded by confluent-kafka's
    own ``AvroSerializer`` through the registry at ``registry_url`` (schemas registered under
    ``<topic>-value``): version 1 below id ``schema_change_at``, version 2 from it; every
    ``corrupt_every``-th record a corrupt payload behind a real header (a bad record)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    v1, v2 = (
        AvroSerializer(client, json.dumps(DEMO_AVRO_V1)),
        AvroSerializer(client, json.dumps(DEMO_AVRO_V2)),
    )
    ctx = SerializationContext(topic, MessageField.VALUE)

    def record(record_id: int, _: int) -> tuple[bytes, bytes]:
        event: dict[str, Any] = {
            "id": record_id,
            "produced_at_ms": int(time.time() * 1000),
            "payload": "x" * payload_bytes,
        }
        if schema_change_at is not None and record_id >= schema_change_at:
            value = v2({**event, "source": "demo-producer-v2"}, ctx)
        else:
            value = v1(event, ctx)
        if corrupt_every and record_id % corrupt_every == corrupt_every - 1:
            value = value[:5] + b"\xff\xff\xff\xff"  # a header of a real schema, a varint that never ends
        return f"k{record_id}".encode(), value

    return record


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
    records: Callable[[int, int], tuple[bytes, bytes]] = demo_record,
) -> int:
    """Produce ``count`` records (until ``stop`` is set when None) with ids from ``start_id``; id
    ``i`` goes to partition ``i % partitions``. ``rate`` caps records per second. Returns the
    number sent (``records``: the key and value of an id; default :func:`demo_record`), every one of them acknowledged by the brokers (``acks=all``, idempotent); raises
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
            key, value = records(record_id, payload_bytes)
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
