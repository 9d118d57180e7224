"""The tests' Schema Registry (kbp_local/schema_registry.py) answers confluent-kafka's own client and
serializers as Confluent's registry does: global, stable ids; versions; BACKWARD compatibility of
Avro with Confluent's error shape; basic auth; TLS. The decoders' tests stand on these answers."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kbp_local.schema_registry import SchemaRegistryServer

V1 = '{"type":"record","name":"User","fields":[{"name":"id","type":"long"}]}'
V2 = (
    '{"type":"record","name":"User","fields":[{"name":"id","type":"long"},'
    '{"name":"email","type":["null","string"],"default":null}]}'
)
# a new field without a default: the new schema cannot read records written with V2
V3_INCOMPATIBLE = (
    '{"type":"record","name":"User","fields":[{"name":"id","type":"long"},'
    '{"name":"email","type":["null","string"],"default":null},{"name":"age","type":"int"}]}'
)


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_ids_are_global_and_stable_and_versions_grow_only_for_new_schemas(schema_registry_client, topic_name):
    client = schema_registry_client
    subject, other = f"{topic_name}-value", f"{topic_name}-other-value"
    first = client.register_schema(subject, Schema(V1, "AVRO"))
    assert client.register_schema(subject, Schema(V1, "AVRO")) == first  # no new version
    assert client.get_versions(subject) == [1]
    assert client.register_schema(other, Schema(V1, "AVRO")) == first  # same schema, same id
    second = client.register_schema(subject, Schema(V2, "AVRO"))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_latest_version(subject)
    assert (latest.schema_id, latest.version, latest.schema.schema_str) == (second, 2, V2)
    v1 = client.get_version(subject, 1)
    assert (v1.schema_id, v1.schema.schema_str, v1.schema.schema_type) == (first, V1, "AVRO")
    assert client.get_schema(first).schema_str == V1
    found = client.lookup_schema(subject, Schema(V2, "AVRO"))
    assert (found.schema_id, found.version) == (second, 2)


def test_an_incompatible_avro_change_is_refused_with_confluents_error(schema_registry_client, topic_name):
    client = schema_registry_client
    subject = f"{topic_name}-value"
    client.register_schema(subject, Schema(V2, "AVRO"))
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(subject, Schema(V3_INCOMPATIBLE, "AVRO"))
    assert (e.value.http_status_code, e.value.error_code) == (409, 409)
    assert "incompatible" in e.value.error_message and "age" in e.value.error_message
    assert client.get_versions(subject) == [1]
    assert client.test_compatibility(subject, Schema(V3_INCOMPATIBLE, "AVRO")) is False
    client.set_compatibility(subject, "NONE")
    assert client.register_schema(subject, Schema(V3_INCOMPATIBLE, "AVRO")) > 0
    assert client.get_versions(subject) == [1, 2]


def test_missing_things_have_confluents_error_codes(schema_registry_client, topic_name):
    client = schema_registry_client
    with pytest.raises(SchemaRegistryError) as e:
        client.get_schema(987654)
    assert (e.value.http_status_code, e.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as e:
        client.get_versions(f"{topic_name}-value")
    assert e.value.error_code == 40401
    client.register_schema(f"{topic_name}-value", Schema(V1, "AVRO"))
    with pytest.raises(SchemaRegistryError) as e:
        client.get_version(f"{topic_name}-value", 5)
    assert e.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(f"{topic_name}-value", Schema('{"type": "nope"}', "AVRO"))
    assert (e.value.http_status_code, e.value.error_code) == (422, 42201)


def test_a_soft_deleted_version_keeps_its_id_and_is_listed_with_deleted(schema_registry_client, topic_name):
    client = schema_registry_client
    subject = f"{topic_name}-value"
    first = client.register_schema(subject, Schema(V1, "AVRO"))
    client.register_schema(subject, Schema(V2, "AVRO"))
    client.delete_version(subject, 1)
    assert client.get_versions(subject) == [2]
    assert client.get_versions(subject, deleted=True) == [1, 2]
    assert client.get_version(subject, 1, deleted=True).schema_id == first
    assert client.get_schema(first).schema_str == V1


def test_the_serializers_write_confluents_wire_format(schema_registry_client, topic_name):
    client = schema_registry_client
    avro_bytes = AvroSerializer(client, V2)({"id": 7, "email": "a@b"}, _ctx(topic_name))
    schema_id = client.get_latest_version(f"{topic_name}-value").schema_id
    assert avro_bytes[:5] == b"\x00" + struct.pack(">I", schema_id)
    assert AvroDeserializer(client)(avro_bytes, _ctx(topic_name)) == {"id": 7, "email": "a@b"}

    json_topic = f"{topic_name}-json"
    schema = '{"type": "object", "properties": {"id": {"type": "integer"}}}'
    json_bytes = JSONSerializer(schema, client)({"id": 3}, _ctx(json_topic))
    registered = client.get_latest_version(f"{json_topic}-value")
    assert registered.schema.schema_type == "JSON"
    assert json_bytes[:5] == b"\x00" + struct.pack(">I", registered.schema_id)
    assert json_bytes[5:].replace(b" ", b"") == b'{"id":3}'


def test_basic_auth_is_required_and_checked(schema_registry):
    for conf in (
        {"url": schema_registry.url},
        {**schema_registry.client_config(), "basic.auth.user.info": "kbp-registry:wrong"},
    ):
        client = SchemaRegistryClient({**conf, "max.retries": 0})
        with pytest.raises(SchemaRegistryError) as e:
            client.get_subjects()
        assert (e.value.http_status_code, e.value.error_code) == (401, 40101)
    assert ("GET", "/subjects", None) in schema_registry.requests


def test_tls_with_the_registrys_ca(tmp_path):
    with SchemaRegistryServer(tls_dir=tmp_path / "tls") as server:
        assert server.url.startswith("https://127.0.0.1:")
        client = SchemaRegistryClient(server.client_config())
        assert client.register_schema("t-value", Schema(V1, "AVRO")) == 1
        untrusting = SchemaRegistryClient({"url": server.url, "max.retries": 0})
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            untrusting.get_subjects()
