"""Records that exercise every column of the Kafka source schema, for reader tests."""

from __future__ import annotations

SAMPLE_TIMESTAMPS_MS = [1_700_000_000_123, 1_700_000_000_456, 1_700_000_000_789]


def produce_sample_records(bootstrap: str, topic: str) -> None:
    """Partition 0 of ``topic`` gets: offset 0 key+value, 1 no key with headers (one empty value),
    2 no value, each with a create time from :data:`SAMPLE_TIMESTAMPS_MS`; then offset 3, a record
    past the ranges the tests read. One record per batch (see the notes on the embedded broker)."""
    from kafka import KafkaProducer

    t0, t1, t2 = SAMPLE_TIMESTAMPS_MS
    producer = KafkaProducer(bootstrap_servers=bootstrap, batch_size=1, linger_ms=0)
    try:
        producer.send(topic, key=b"k0", value=b"v0", partition=0, timestamp_ms=t0).get()
        producer.send(topic, value=b"v1", partition=0, headers=[("h", b"x"), ("e", b"")], timestamp_ms=t1).get()
        producer.send(topic, key=b"k2", value=None, partition=0, timestamp_ms=t2).get()
        producer.send(topic, key=b"k3", value=b"after", partition=0).get()
    finally:
        producer.close()
