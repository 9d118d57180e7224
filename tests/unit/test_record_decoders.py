"""The record decoders' pure parts: the registry of formats, option checks, what prepare resolves
from a registry's schemas (checked by Avro's schema resolution), the JSON Schema → Spark type
mapping, and the registry client's errors. Spark's side: tests/integration/test_record_decoders.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_kafka_backpressure import decoders
from airflow_kafka_backpressure.decoders import (
    DECODERS,
    DecoderError,
    DecoderSpec,
    RecordDecoder,
    RegisteredSchema,
    decoder_for,
    decoder_from_spec,
)
from airflow_kafka_backpressure.decoders.avro_decoder import DECODED_MARK, incompatibility, marked_reader
from airflow_kafka_backpressure.decoders.json_schema import spark_type
from airflow_kafka_backpressure.decoders.registry import ConfluentSchemas

V1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
V3 = {**V2, "fields": [*V2["fields"], {"name": "age", "type": "int"}]}  # no default: V3 cannot read V2


class Schemas:
    """An in-memory SchemaSource: subject -> [(id, type, text, references)] (versions 1, 2, …)."""

    where = "schema registry connection 'sr'"

    def __init__(self, subjects: dict[str, list[tuple[int, str, Any]]], refs: tuple = ()) -> None:
        self.subjects = {
            s: [(i, kind, t if isinstance(t, str) else json.dumps(t)) for i, kind, t in vs]
            for s, vs in subjects.items()
        }
        self.refs = refs
        self.asked: list[tuple[str, Any]] = []

    def version(
        self, subject: str, version: int | str = "latest", *, deleted: bool = False
    ) -> RegisteredSchema:
        self.asked.append((subject, version))
        if subject not in self.subjects:
            raise DecoderError(f"{self.where}: subject {subject!r} not found")
        versions = self.subjects[subject]
        number = len(versions) if version == "latest" else int(version)
        i, kind, text = versions[number - 1]
        return RegisteredSchema(i, kind, text, subject, number, self.refs)

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        return list(range(1, len(self.subjects[subject]) + 1))

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        raise AssertionError("not used")


def test_the_registry_names_every_format_and_takes_new_ones():
    assert decoders.decoder_names() == ("raw", "avro", "json")
    assert decoders.DEFAULT_FORMAT == "raw"
    assert {n: k.spark_artifacts for n, k in DECODERS.items()} == {
        "raw": (),
        "avro": ("org.apache.spark:spark-avro_2.13",),
        "json": (),  # from_json is Spark's own
    }
    with pytest.raises(DecoderError, match="unknown value_format 'protobuf': choose one of raw, avro, json"):
        decoder_for("protobuf", "value")

    class Upper(RecordDecoder):
        name = "upper"

        def prepare(self, topics, registry):
            return DecoderSpec(self.name, self.field, self.options, {})

        def decode(self, raw, spec):
            return raw

    saved = dict(DECODERS)
    try:
        decoders.register(Upper)
        assert "upper" in decoders.decoder_names()
        spec = decoder_for("upper", "key").prepare(["t"], None)
        assert isinstance(decoder_from_spec(DecoderSpec.from_dict(spec.to_dict())), Upper)
    finally:
        DECODERS.clear()
        DECODERS.update(saved)


@pytest.mark.parametrize(
    "name, field, options, message",
    [
        (
            "avro",
            "value",
            {"subjct": "x"},
            "the value's avro format: unknown option(s) 'subjct' (this format takes: subject, version)",
        ),
        (
            "avro",
            "key",
            {"version": 0},
            "the key's avro format: version must be 'latest' or a number >= 1, got 0",
        ),
        ("avro", "value", {"subject": ""}, "subject must be a non-empty string"),
        (
            "json",
            "value",
            {"schema": "id INT", "subject": "s"},
            "either schema (declared) or subject/version",
        ),
        (
            "json",
            "value",
            {"schema": {"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}},
            "#/properties/x",
        ),
        (
            "json",
            "value",
            {"schema": "id INT", "confluent_header": "yes"},
            "confluent_header must be true or false",
        ),
        ("raw", "value", {"anything": 1}, "unknown option(s) 'anything' (this format takes: none)"),
        ("raw", "headers", {}, "a decoder decodes one of key, value, not 'headers'"),
    ],
)
def test_wrong_options_are_refused_naming_the_field_and_the_key(name, field, options, message):
    with pytest.raises(DecoderError) as e:
        decoder_for(name, field, options)
    assert message in str(e.value)


def test_avro_reads_every_version_of_the_subject_into_the_latest_and_keeps_incompatible_ones_as_reasons():
    # V3 was registered under compatibility NONE: it cannot read V1 or V2 (age has no default),
    # while a reader pinned to V2 reads all three (a reader ignores a writer's extra field)
    source = Schemas({"orders-value": [(11, "AVRO", V1), (12, "AVRO", V2), (13, "AVRO", V3)]})
    latest = decoder_for("avro", "value").prepare(["orders"], source)
    assert latest.resolved["reader"] | {"schema": None} == {
        "subject": "orders-value",
        "version": 3,
        "id": 13,
        "schema": None,
        "record": True,
    }
    assert sorted(latest.resolved["writers"]) == ["13"]
    assert sorted(latest.resolved["incompatible"]) == ["11", "12"]
    problem = latest.resolved["incompatible"]["11"]
    for part in ("subject 'orders-value' version 1 (id 11)", "version 3 (id 13)", "age", "default"):
        assert part in problem, (part, problem)

    pinned = decoder_for("avro", "value", {"version": 2}).prepare(["orders"], source)
    assert pinned.resolved["reader"]["version"] == 2
    assert sorted(pinned.resolved["writers"]) == ["11", "12", "13"]
    assert pinned.resolved["incompatible"] == {}
    reader = json.loads(pinned.resolved["reader"]["schema"])
    assert reader["fields"][-1] == {"name": DECODED_MARK, "type": "boolean", "default": True}
    assert json.loads(pinned.resolved["writers"]["11"]["schema"]) == V1  # writers as registered


def test_avro_with_several_topics_reads_each_topics_subject_into_the_first_ones():
    source = Schemas({"a-value": [(1, "AVRO", V1), (2, "AVRO", V2)], "b-value": [(1, "AVRO", V1)]})
    spec = decoder_for("avro", "value").prepare(["a", "b"], source)
    assert spec.resolved["subjects"] == ["a-value", "b-value"]
    assert spec.resolved["reader"]["subject"] == "a-value" and sorted(spec.resolved["writers"]) == ["1", "2"]
    one = decoder_for("avro", "key", {"subject": "shared-key"}).subjects(["a", "b"])
    assert one == ["shared-key"]


@pytest.mark.parametrize(
    "subjects, refs, fragment",
    [
        ({"t-value": [(1, "JSON", '{"type": "object"}')]}, (), "is a JSON schema, not Avro"),
        ({"t-value": [(1, "AVRO", V1)]}, ({"name": "x", "subject": "y", "version": 1},), "schema references"),
        ({}, (), "subject 't-value' not found"),
    ],
)
def test_avro_prepare_refuses_what_it_cannot_read(subjects, refs, fragment):
    with pytest.raises(DecoderError, match=fragment):
        decoder_for("avro", "value").prepare(["t"], Schemas(subjects, refs))


def test_a_decoder_of_the_registry_without_one_names_the_setting():
    with pytest.raises(DecoderError, match="schema_registry_conn_id"):
        decoder_for("avro", "value").prepare(["t"], None)
    assert decoder_for("json", "value", {"schema": "id INT"}).uses_registry() is False
    assert decoder_for("json", "value").uses_registry() is True


def test_the_marked_reader_adds_one_field_to_a_record_and_leaves_other_types():
    marked = json.loads(marked_reader(json.dumps(V2)))
    assert [f["name"] for f in marked["fields"]] == ["id", "email", DECODED_MARK]
    assert marked_reader('"string"') == '"string"'
    clash = {**V1, "fields": [{"name": DECODED_MARK, "type": "boolean"}]}
    with pytest.raises(DecoderError, match=DECODED_MARK):
        marked_reader(json.dumps(clash))


def test_incompatibility_is_avros_schema_resolution():
    v1 = RegisteredSchema(1, "AVRO", json.dumps(V1), "s", 1)
    v2 = RegisteredSchema(2, "AVRO", json.dumps(V2), "s", 2)
    renamed = RegisteredSchema(3, "AVRO", json.dumps({**V1, "name": "Other"}), "s", 3)
    assert incompatibility(v2, v1) is None  # a new optional field: v2 reads v1
    assert incompatibility(v1, v2) is None  # a reader ignores a writer's extra field
    assert "name mismatch" in (incompatibility(v1, renamed) or "")


def test_json_schema_maps_to_spark_types():
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "price": {"type": ["number", "null"]},
            "ok": {"type": "boolean"},
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
            "kind": {"enum": ["a", "b"]},
            "owner": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/person"}]},
        },
        "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }
    fields = {f["name"]: f["type"] for f in spark_type(schema)["fields"]}
    assert fields == {
        "id": "long",
        "price": "double",
        "ok": "boolean",
        "at": "timestamp",
        "day": "date",
        "tags": {"type": "array", "elementType": "string", "containsNull": True},
        "attrs": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
        "kind": "string",
        "owner": {
            "type": "struct",
            "fields": [{"name": "name", "type": "string", "nullable": True, "metadata": {}}],
        },
    }


@pytest.mark.parametrize(
    "schema, fragment",
    [
        ({"type": "array", "items": {"type": "string"}}, "top level must be an object"),
        (
            {"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
            "#/properties/x: a union of 2 types",
        ),
        (
            {
                "type": "object",
                "properties": {"n": {"$ref": "#/definitions/n"}},
                "definitions": {"n": {"type": "object", "properties": {"next": {"$ref": "#/definitions/n"}}}},
            },
            "refers to itself",
        ),
        ({"type": "object", "properties": {"x": {"description": "?"}}}, "#/properties/x: no 'type'"),
        ({"type": "object", "properties": {"x": {"$ref": "other.json#/a"}}}, "only local references"),
        ({"type": "object", "properties": {"x": {}}}, "any JSON value is allowed here"),
    ],
)
def test_json_schema_parts_spark_cannot_type_are_named(schema, fragment):
    with pytest.raises(DecoderError, match=fragment):
        spark_type(schema)


def test_json_prepare_declared_and_from_the_registry():
    declared = decoder_for(
        "json", "value", {"schema": {"type": "object", "properties": {"id": {"type": "integer"}}}}
    )
    spec = declared.prepare(["t"], None)
    assert spec.resolved == {
        "header": False,
        "known_ids": None,
        "spark_type": {
            "type": "struct",
            "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
        },
    }
    ddl = decoder_for("json", "value", {"schema": "id BIGINT", "confluent_header": True}).prepare(["t"], None)
    assert ddl.resolved == {"header": True, "known_ids": None, "ddl": "id BIGINT"}

    v1 = {"type": "object", "properties": {"id": {"type": "integer"}}}
    v2 = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    source = Schemas({"t-value": [(5, "JSON", v1), (6, "JSON", v2)]})
    registry = decoder_for("json", "value").prepare(["t"], source)
    assert registry.resolved["header"] is True and registry.resolved["known_ids"] == [5, 6]
    assert [f["name"] for f in registry.resolved["spark_type"]["fields"]] == ["id", "name"]
    with pytest.raises(DecoderError, match="is a AVRO schema, not a JSON Schema"):
        decoder_for("json", "value").prepare(["t"], Schemas({"t-value": [(1, "AVRO", V1)]}))


def test_a_spec_is_plain_json_and_round_trips():
    source = Schemas({"t-value": [(1, "AVRO", V1), (2, "AVRO", V2)]})
    spec = decoder_for("avro", "value").prepare(["t"], source)
    again = DecoderSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == DecoderSpec(
        spec.name, spec.field, dict(spec.options), json.loads(json.dumps(spec.resolved))
    )


class _Client:
    """confluent-kafka's client, answering every call with one SchemaRegistryError."""

    def __init__(self, status: int, code: int, message: str) -> None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        self.error = SchemaRegistryError(status, code, message)

    def get_version(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error

    get_versions = get_schema = get_version


@pytest.mark.parametrize(
    "status, code, fix",
    [
        (401, 40101, "check the connection's user and password"),
        (404, 40401, "register the schema"),
        (404, 40402, "pin a version the subject has"),
        (404, 40403, "the id is not in this registry"),
    ],
)
def test_registry_errors_name_the_connection_the_subject_and_the_fix(status, code, fix):
    schemas = ConfluentSchemas(
        _Client(status, code, "the registry's words"), "schema registry connection 'sr'"
    )
    with pytest.raises(DecoderError) as e:
        schemas.version("orders-value", 3)
    message = str(e.value)
    for part in (
        "schema registry connection 'sr'",
        "version 3 of subject 'orders-value'",
        "the registry's words",
        fix,
    ):
        assert part in message, (part, message)


def test_the_decoders_import_no_airflow_spark_or_clients():
    """The pipelines file's validation constructs decoders: importing them pulls in nothing heavy
    (pyspark, the registry client, Avro are imported where they are used)."""
    import subprocess
    import sys

    modules = [
        "airflow_kafka_backpressure.decoders",
        "airflow_kafka_backpressure.decoders.frame",
        "airflow_kafka_backpressure.decoders.registry",
    ]
    forbidden = ("airflow", "pyspark", "py4j", "kafka", "confluent_kafka", "avro", "fastavro")
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({forbidden!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_sql_literals_stay_readable_when_plain_and_exact_otherwise():
    from airflow_kafka_backpressure import sql_text as sql

    assert sql.string("value: ") == "'value: '"
    for text in ("it's", "a\\b", "h\u00e9", "two\nlines", "tab\there"):
        assert sql.string(text) == f"CAST(X'{text.encode().hex()}' AS STRING)"
    assert sql.binary(b"\x00\x00\x00\x00\x07") == "X'0000000007'"
    assert sql.ident("kafka_key") == "`kafka_key`" and sql.ident("a`b") == "`a``b`"
    assert sql.options_map({"mode": "PERMISSIVE"}) == "map('mode', 'PERMISSIVE')"
    assert sql.any_of([]) == "false" and sql.any_of(["a", "b"]) == "(a) OR (b)"


def test_the_wire_formats_checks_are_sql_over_the_column_they_are_given():
    from airflow_kafka_backpressure.decoders import wire

    assert wire.is_one_of("`value`", [7, 3]) == "substr(`value`, 1, 5) IN (X'0000000003', X'0000000007')"
    assert wire.is_one_of("`value`", []) == "false"
    assert wire.by_schema_id("`k`", {}) == "NULL"
    assert wire.by_schema_id("`k`", {2: "e2", 1: "e1"}) == (
        "CASE WHEN substr(`k`, 1, 5) = X'0000000001' THEN e1 WHEN substr(`k`, 1, 5) = X'0000000002' THEN e2 END"
    )
    assert wire.payload("`k`") == "substr(`k`, 6)"
