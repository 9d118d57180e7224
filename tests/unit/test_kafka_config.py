from __future__ import annotations

import pytest

from airflow_kafka_backpressure.kafka.config import (
    LIBRDKAFKA_ONLY,
    SUPPORTED_PROPERTIES,
    KafkaConfigError,
    redact,
    to_confluent,
    to_kafka_python,
    to_spark_kafka_options,
)

SASL = {
    "bootstrap.servers": "b1:9093,b2:9093",
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "svc",
    "sasl.password": "pw",
    "ssl.ca.location": "/etc/ca.pem",
    "group.id": "ignored",
}


def test_librdkafka_properties_map_to_kafka_python():
    cfg = to_kafka_python(SASL)
    assert cfg == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "pw",
        "ssl_cafile": "/etc/ca.pem",
    }


def test_missing_bootstrap_and_unknown_keys_and_bad_values_are_named():
    with pytest.raises(KafkaConfigError, match="'bootstrap.servers' is missing"):
        to_kafka_python({}, source="Kafka connection 'k'")
    with pytest.raises(
        KafkaConfigError, match=r"Kafka connection 'k': unsupported Kafka properties \['bootstrap.server'\]"
    ):
        to_kafka_python({"bootstrap.server": "x"}, source="Kafka connection 'k'")
    with pytest.raises(KafkaConfigError, match="'request.timeout.ms' has an invalid value 'soon'"):
        to_kafka_python({"bootstrap.servers": "x", "request.timeout.ms": "soon"})


def test_spark_native_options_carry_jaas_and_pem_truststore():
    opts = to_spark_kafka_options(SASL)
    assert opts["kafka.bootstrap.servers"] == "b1:9093,b2:9093"
    assert opts["kafka.security.protocol"] == "sasl_ssl"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
    )
    assert 'username="svc" password="pw";' in opts["kafka.sasl.jaas.config"]
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert "kafka.group.id" not in opts and "kafka.sasl.username" not in opts


def test_redact_hides_secrets():
    assert redact(SASL)["sasl.password"] == "***"
    assert redact(SASL)["sasl.username"] == "svc"


# --------------------------------------------------------------------------- confluent-kafka


def test_confluent_takes_librdkafka_names_and_renames_java_style_ones():
    cfg = to_confluent(
        {
            **SASL,
            "request.timeout.ms": "15000",
            "fetch.max.wait.ms": 100,
            "receive.buffer.bytes": "65536",
            "check.crcs": "true",
            "ssl.endpoint.identification.algorithm": "none",
            "queued.max.messages.kbytes": "2048",
        }
    )
    assert cfg == {
        **{k: v for k, v in SASL.items() if k != "group.id"},  # librdkafka names, values as written
        "socket.timeout.ms": 15000,
        "fetch.wait.max.ms": 100,
        "socket.receive.buffer.bytes": 65536,
        "check.crcs": True,
        "ssl.endpoint.identification.algorithm": "none",
        "queued.max.messages.kbytes": 2048,
    }  # group.id is the caller's business


def test_both_clients_refuse_the_same_keys_and_values():
    for convert in (to_kafka_python, to_confluent):
        with pytest.raises(
            KafkaConfigError,
            match=r"Kafka connection 'k': unsupported Kafka properties \['max.poll.records'\]",
        ):
            convert({"bootstrap.servers": "x", "max.poll.records": 5}, source="Kafka connection 'k'")
        with pytest.raises(KafkaConfigError, match="'bootstrap.servers' is missing"):
            convert({"security.protocol": "SSL"})
        with pytest.raises(
            KafkaConfigError, match="'queued.max.messages.kbytes' has an invalid value 'lots'"
        ):
            convert({"bootstrap.servers": "x", "queued.max.messages.kbytes": "lots"})
        with pytest.raises(KafkaConfigError, match="'check.crcs' has an invalid value 'maybe'"):
            convert({"bootstrap.servers": "x", "check.crcs": "maybe"})


def test_librdkafka_only_properties_are_left_out_for_kafka_python_and_spark():
    props = {"bootstrap.servers": "x", "queued.max.messages.kbytes": 1024, "fetch.queue.backoff.ms": 5}
    assert set(LIBRDKAFKA_ONLY) >= {"queued.max.messages.kbytes", "fetch.queue.backoff.ms"}
    assert to_kafka_python(props) == {"bootstrap_servers": "x"}
    assert to_spark_kafka_options(props) == {"kafka.bootstrap.servers": "x"}


def test_librdkafka_accepts_every_supported_property_as_a_consumer_property():
    """A real librdkafka consumer built from every supported property: no unknown property, none
    ignored as a producer-only property."""
    import logging

    from confluent_kafka import Consumer

    values = {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "plaintext",
        "sasl.mechanism": "PLAIN",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "sasl.kerberos.service.name": "kafka",
        "ssl.ca.location": "/tmp/ca.pem",
        "ssl.certificate.location": "/tmp/cert.pem",
        "ssl.key.location": "/tmp/key.pem",
        "ssl.key.password": "k",
        "ssl.crl.location": "/tmp/crl.pem",
        "ssl.endpoint.identification.algorithm": "https",
        "client.id": "c",
        "request.timeout.ms": 30000,
        "socket.connection.setup.timeout.ms": 10000,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        "retry.backoff.ms": 100,
        "metadata.max.age.ms": 60000,
        "connections.max.idle.ms": 60000,
        "receive.buffer.bytes": 65536,
        "send.buffer.bytes": 65536,
        "fetch.max.bytes": 1048576,
        "max.partition.fetch.bytes": 1048576,
        "fetch.min.bytes": 1,
        "fetch.max.wait.ms": 100,
        "isolation.level": "read_committed",
        "check.crcs": "false",
        "client.dns.lookup": "use_all_dns_ips",
        "queued.max.messages.kbytes": 1024,
        "queued.min.messages": 1000,
        "fetch.queue.backoff.ms": 10,
        "fetch.error.backoff.ms": 10,
        "socket.keepalive.enable": "true",
        "debug": "consumer",
    }
    assert set(values) == set(SUPPORTED_PROPERTIES)
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("test.librdkafka")
    logger.addHandler(Collect())
    logger.setLevel(logging.DEBUG)
    consumer = Consumer({**to_confluent(values), "group.id": "g", "logger": logger})
    consumer.close()
    assert not [m for m in messages if "ignored" in m or "No such configuration property" in m], messages
