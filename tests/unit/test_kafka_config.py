from __future__ import annotations

import pytest

from airflow_kafka_backpressure.kafka_config import (
    KafkaConfigError,
    redact,
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
    with pytest.raises(KafkaConfigError, match=r"Kafka connection 'k': unsupported Kafka properties \['bootstrap.server'\]"):
        to_kafka_python({"bootstrap.server": "x"}, source="Kafka connection 'k'")
    with pytest.raises(KafkaConfigError, match="'request.timeout.ms' has an invalid value 'soon'"):
        to_kafka_python({"bootstrap.servers": "x", "request.timeout.ms": "soon"})


def test_spark_native_options_carry_jaas_and_pem_truststore():
    opts = to_spark_kafka_options(SASL)
    assert opts["kafka.bootstrap.servers"] == "b1:9093,b2:9093"
    assert opts["kafka.security.protocol"] == "sasl_ssl"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    assert 'username="svc" password="pw";' in opts["kafka.sasl.jaas.config"]
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert "kafka.group.id" not in opts and "kafka.sasl.username" not in opts


def test_redact_hides_secrets():
    assert redact(SASL)["sasl.password"] == "***"
    assert redact(SASL)["sasl.username"] == "svc"
