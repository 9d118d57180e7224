"""Records that exercise every column of the Kafka source schema, for reader tests."""

from __future__ import annotations

SAMPLE_TIMESTAMPS_MS = [1_700_000_000_123, 1_700_000_000_456, 1_700_000_000_789]


def produce_sample_records(bootstrap: str, topic: str) -> None:
    """Partition 0 of ``topic`` gets: offset 0 key+value, 1 no key with headers (one empty value),
    2 no value, each with a create time from :data:`SAMPLE_TIMESTAMPS_MS`; then offset 3, a record
    past the ranges the tests read. All four go in one record batch, as a batching producer sends them."""
    from kafka import KafkaProducer

    t0, t1, t2 = SAMPLE_TIMESTAMPS_MS
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=1000)
    try:
        futures = [
            producer.send(topic, key=b"k0", value=b"v0", partition=0, timestamp_ms=t0),
            producer.send(
                topic, value=b"v1", partition=0, headers=[("h", b"x"), ("e", b"")], timestamp_ms=t1
            ),
            producer.send(topic, key=b"k2", value=None, partition=0, timestamp_ms=t2),
            producer.send(topic, key=b"k3", value=b"after", partition=0),
        ]
        producer.flush()
        assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    finally:
        producer.close()


def delete_records(bootstrap: str, before: dict) -> None:
    """Delete every record below ``before[tp]`` (Kafka's DeleteRecords: the log start offset moves
    there, as retention moves it), then check the broker reports the new earliest offsets."""
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka import TopicPartition as KTP

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({KTP(tp.topic, tp.partition): offset for tp, offset in before.items()})
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        earliest = consumer.beginning_offsets([KTP(tp.topic, tp.partition) for tp in before])
        assert {(k.topic, k.partition): v for k, v in earliest.items()} == {
            (tp.topic, tp.partition): offset for tp, offset in before.items()
        }, earliest
    finally:
        consumer.close()


def consumer_group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """``{(topic, partition): (committed offset, log end offset)}`` of ``group`` as Kafka's own
    ``kafka-consumer-groups.sh --describe`` prints them (its class, run from the broker's jars)."""
    import subprocess

    from kbp_local.apache_kafka import java_binary
    from kbp_local.jars import jar_paths, kafka_broker_jars

    out = subprocess.run(
        [
            java_binary(),
            "-Xmx256m",
            "-cp",
            ":".join(jar_paths(kafka_broker_jars())),
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--group",
            group,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[0] == group and cols[2].isdigit():
            rows[(cols[1], int(cols[2]))] = (int(cols[3]), int(cols[4]))
    assert rows, out
    return rows


def recreate_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> tuple[str, str]:
    """Delete ``topic`` and create it again with ``partitions`` partitions, as an operator would;
    returns its topic ids (before, after). Creation is retried while the broker still finishes the
    deletion."""
    import time

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        before = admin.describe_topics([topic])[0]["topic_id"]
        admin.delete_topics([topic])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
                break
            except KafkaError:  # still being deleted
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        while True:  # every partition has a leader again
            described = admin.describe_topics([topic])[0]
            if len(described["partitions"]) == partitions and all(
                p["leader_id"] >= 0 for p in described["partitions"]
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} has no leaders after its creation: {described}")
            time.sleep(0.2)
        after = described["topic_id"]
    finally:
        admin.close()
    assert before != after, (before, after)
    return str(before), str(after)
