"""SchemaRegistryHook: a ``schema_registry`` connection → confluent-kafka's client → the decoders'
schemas, against the tests' registry (kbp_local/schema_registry.py) with basic auth and TLS. The
credentials reach the client and nothing else: not a message, a log line or a prepared spec."""

from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka.schema_registry import Schema

from airflow_kafka_backpressure.decoders import DecoderError, decoder_for
from airflow_kafka_backpressure.hooks.schema_registry import SchemaRegistryError, SchemaRegistryHook
from kbp_local.schema_registry import SchemaRegistryServer

V1 = '{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}'


def _connection(monkeypatch, conn_id: str, **fields) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "schema_registry", **fields})
    )
    return conn_id


def _auth_connection(monkeypatch, registry: SchemaRegistryServer, conn_id: str = "sr_test", **extra) -> str:
    user, password = registry.auth or ("", "")
    return _connection(monkeypatch, conn_id, host=registry.url, login=user, password=password, extra=extra)


def test_the_hook_reads_schemas_with_the_connections_credentials_and_shows_them_nowhere(
    schema_registry, schema_registry_client, topic_name, monkeypatch, caplog
):
    schema_registry_client.register_schema(f"{topic_name}-value", Schema(V1, "AVRO"))
    conn_id = _auth_connection(monkeypatch, schema_registry)
    hook = SchemaRegistryHook(conn_id)
    ok, message = hook.test_connection()
    assert ok, message
    assert f"schema registry connection {conn_id!r}: connected to {schema_registry.url}" in message

    with caplog.at_level(logging.DEBUG):
        spec = decoder_for("avro", "value").prepare([topic_name], hook.schemas())
    assert spec.resolved["reader"]["subject"] == f"{topic_name}-value"
    password = schema_registry.auth[1]
    plan = json.dumps(spec.to_dict())
    for secret in (password, schema_registry.url, schema_registry.auth[0]):
        assert secret not in plan
    assert password not in caplog.text and password not in message
    # what the registry saw: the connection's user on every request
    assert {user for _, path, user in schema_registry.requests if topic_name in path} == {
        schema_registry.auth[0]
    }


def test_a_wrong_password_is_named_without_the_password(schema_registry, topic_name, monkeypatch):
    conn_id = _connection(
        monkeypatch,
        "sr_wrong",
        host=schema_registry.url,
        login=schema_registry.auth[0],
        password="not-the-password-42",
    )
    hook = SchemaRegistryHook(conn_id)
    with pytest.raises(DecoderError) as e:
        decoder_for("avro", "value").prepare([topic_name], hook.schemas())
    message = str(e.value)
    assert "schema registry connection 'sr_wrong'" in message and "user and password" in message
    assert "not-the-password-42" not in message
    ok, tested = hook.test_connection()
    assert not ok and "not-the-password-42" not in tested and "'sr_wrong'" in tested


def test_credentials_in_the_url_are_refused_without_being_repeated(monkeypatch):
    conn_id = _connection(
        monkeypatch, "sr_userinfo", host="https://me:s3cret-in-url@registry.example.com:8081"
    )
    with pytest.raises(SchemaRegistryError) as e:
        SchemaRegistryHook(conn_id).client_config()
    assert "Login and Password" in str(e.value) and "s3cret-in-url" not in str(e.value)


def test_host_and_port_without_a_scheme_and_the_client_settings(monkeypatch):
    conn_id = _connection(
        monkeypatch,
        "sr_fields",
        host="registry.internal",
        port=8081,
        login="svc",
        password="pw",
        extra={"ca_location": "/etc/ca.pem", "timeout_s": 5},
    )
    assert SchemaRegistryHook(conn_id).client_config() == {
        "url": "http://registry.internal:8081",
        "basic.auth.user.info": "svc:pw",
        "ssl.ca.location": "/etc/ca.pem",
        "timeout": 5.0,
    }
    no_host = _connection(monkeypatch, "sr_nohost")
    with pytest.raises(SchemaRegistryError, match="'sr_nohost' has no Host"):
        SchemaRegistryHook(no_host).client_config()


def test_tls_with_the_connections_ca(tmp_path, topic_name, monkeypatch):
    with SchemaRegistryServer(auth=("u", "p"), tls_dir=tmp_path / "tls") as registry:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        SchemaRegistryClient(registry.client_config()).register_schema(
            f"{topic_name}-value", Schema(V1, "AVRO")
        )
        trusted = _auth_connection(monkeypatch, registry, "sr_tls", ca_location=str(registry.ca_path))
        spec = decoder_for("avro", "value").prepare([topic_name], SchemaRegistryHook(trusted).schemas())
        assert spec.resolved["reader"]["version"] == 1

        untrusted = _auth_connection(monkeypatch, registry, "sr_tls_no_ca", timeout_s=5)
        hook = SchemaRegistryHook(untrusted)
        with pytest.raises(
            DecoderError,
            match="'sr_tls_no_ca': could not read .*(CERTIFICATE_VERIFY_FAILED|certificate verify failed)",
        ):
            decoder_for("avro", "value").prepare([topic_name], hook.schemas())
