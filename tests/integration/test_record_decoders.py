"""The record decoders on real parts: records encoded by confluent-kafka's own AvroSerializer and
JSONSerializer against the tests' Schema Registry, on the session's Apache Kafka broker, read by
Spark's Kafka source (local[2]) and decoded in the JVM (spark-avro's from_avro, from_json).

Every record lands once: a good one in typed columns (records written with an older compatible
schema in the reader schema's columns), a bad one in the error table's rows with its reason —
from one decode of the same data."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_kafka_backpressure import sql_text as sql
from airflow_kafka_backpressure.decoders import decoder_for
from airflow_kafka_backpressure.decoders.frame import (
    ERROR_TABLE_COLUMNS,
    METADATA_COLUMNS,
    bad_rows,
    decode_frame,
    fatal_rows,
    good_rows,
    query_rows,
)
from airflow_kafka_backpressure.hooks.schema_registry import SchemaRegistryHook

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
# compatible (BACKWARD): a new optional field
V2 = {**V1, "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}]}
# incompatible: a new field without a default cannot be read from V2's records
V3 = {**V2, "fields": [*V2["fields"], {"name": "qty", "type": "int"}]}


def _topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    """One partition, in order: record i is at offset i."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def _read(spark: Any, bootstrap: str, topic: str) -> Any:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )


def _registry_conn(monkeypatch, registry) -> SchemaRegistryHook:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SR_DECODERS",
        json.dumps(
            {
                "conn_type": "schema_registry",
                "host": registry.url,
                "login": registry.auth[0],
                "password": registry.auth[1],
            }
        ),
    )
    return SchemaRegistryHook("sr_decoders")


def _ctx(topic: str, field: str = "value") -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE if field == "value" else MessageField.KEY)


def _by_offset(rows: list[Any], column: str) -> dict[int, Any]:
    return {r[column]: r for r in rows}


def test_avro_with_a_compatible_change_mid_stream_and_bad_records(
    spark, kafka_broker, schema_registry, schema_registry_client, topic_name, monkeypatch
):
    bootstrap, client = kafka_broker.bootstrap, schema_registry_client
    _topic(bootstrap, topic_name)
    key_of = AvroSerializer(client, '"string"')  # a primitive schema: keys are often one
    v1, v2 = AvroSerializer(client, json.dumps(V1)), AvroSerializer(client, json.dumps(V2))

    def key(k: str) -> bytes:
        return key_of(k, _ctx(topic_name, "key"))

    good = [(key(f"k{i}"), v1({"id": i, "item": f"i{i}"}, _ctx(topic_name))) for i in range(3)]  # 0-2
    good += [
        (key(f"k{i}"), v2({"id": i, "item": f"i{i}", "coupon": f"c{i}"}, _ctx(topic_name)))
        for i in range(3, 5)
    ]
    good += [(key("k5"), v2({"id": 5, "item": "i5", "coupon": None}, _ctx(topic_name)))]  # 5
    v1_id = client.get_version(f"{topic_name}-value", 1).schema_id
    header = b"\x00" + struct.pack(">I", v1_id)
    bad = [
        (key("b6"), header + b"\xff\xff\xff"),  # 6: a varint that never ends
        (key("b7"), b"\x00" + struct.pack(">I", 424242) + good[0][1][5:]),  # 7: an id nobody registered
        (key("b8"), b'{"id": 8, "item": "json"}'),  # 8: not the wire format
        (key("b9"), b"\x00\x01"),  # 9: shorter than the header
        (key("b10"), b"\x00\xff\xff\xff\xff" + b"x"),  # 10: an id past a 32-bit int's range
        (b"not-avro", good[0][1]),  # 11: the key is bad, the value good
    ]
    tombstone = [(key("k12"), None)]  # 12: a deleted key: no value, not a bad record
    _produce(bootstrap, topic_name, good + bad + tombstone)

    hook = _registry_conn(monkeypatch, schema_registry)
    schemas = hook.schemas()
    specs = {f: decoder_for("avro", f).prepare([topic_name], schemas) for f in ("key", "value")}
    assert specs["value"].resolved["reader"]["version"] == 2

    decoded = decode_frame(_read(spark, bootstrap, topic_name), specs).persist()
    try:
        rows = query_rows(decoded).collect()
        errors = bad_rows(decoded).collect()
        typed = good_rows(decoded).collect()
        plan = decoded._jdf.queryExecution().optimizedPlan().toString()
        columns = query_rows(decoded).columns
    finally:
        decoded.unpersist()

    # the good records once each, in v2's columns: v1's with coupon null
    assert columns == ["id", "item", "coupon", *METADATA_COLUMNS.values()]
    got = _by_offset(rows, "kafka_offset")
    assert sorted(got) == [0, 1, 2, 3, 4, 5, 12]
    for offset in range(6):
        r = got[offset]
        assert (r["id"], r["item"], r["kafka_key"], r["kafka_topic"], r["kafka_partition"]) == (
            offset,
            f"i{offset}",
            f"k{offset}",
            topic_name,
            0,
        )
    assert [got[o]["coupon"] for o in range(6)] == [None, None, None, "c3", "c4", None]
    assert got[12]["id"] is None and got[12]["kafka_key"] == "k12"
    assert _by_offset(typed, "offset")[4]["value"].asDict() == {"id": 4, "item": "i4", "coupon": "c4"}

    # the bad ones once each, with their raw bytes and why
    assert [c for c in ERROR_TABLE_COLUMNS] == [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        "reason",
    ]
    failed = _by_offset(errors, "offset")
    assert sorted(failed) == list(range(6, 12))
    for offset, (raw_key, raw_value) in zip(range(6, 12), bad):
        assert (bytes(failed[offset]["key"]), bytes(failed[offset]["value"])) == (raw_key, raw_value)
    reasons = {o: r["reason"] for o, r in failed.items()}
    assert reasons[6].startswith(f"value: corrupt payload: Avro could not read it as schema id {v1_id} ")
    assert reasons[7].startswith("value: unknown schema id 424242 (not a version of ")
    assert reasons[8] == "value: wrong magic byte 0x7b (Confluent's wire format starts with 0x00)"
    assert reasons[9].startswith("value: too short for Confluent's wire format (2 bytes")
    assert reasons[10].startswith("value: unknown schema id 4294967295 ")
    assert reasons[11] == "key: wrong magic byte 0x6e (Confluent's wire format starts with 0x00)"
    assert fatal_rows(decoded).count() == 0

    # decoded once: one from_avro per writer schema (the value's two, the key's one), not per use
    assert plan.count("from_avro(") == 3, plan


def test_an_incompatible_writer_fails_the_batch_unless_the_reader_is_pinned(
    spark, kafka_broker, schema_registry, schema_registry_client, topic_name, monkeypatch
):
    bootstrap, client = kafka_broker.bootstrap, schema_registry_client
    _topic(bootstrap, topic_name)
    subject = f"{topic_name}-value"
    v2 = AvroSerializer(client, json.dumps(V2))
    first = v2({"id": 1, "item": "a", "coupon": "x"}, _ctx(topic_name))
    client.set_compatibility(subject, "NONE")  # someone let an incompatible change through
    v3 = AvroSerializer(client, json.dumps(V3))
    second = v3({"id": 2, "item": "b", "coupon": None, "qty": 3}, _ctx(topic_name))
    _produce(bootstrap, topic_name, [(None, first), (None, second)])
    schemas = _registry_conn(monkeypatch, schema_registry).schemas()
    df = _read(spark, bootstrap, topic_name)

    latest = decoder_for("avro", "value").prepare([topic_name], schemas)
    fatal = fatal_rows(decode_frame(df, {"value": latest})).collect()
    assert [r["offset"] for r in fatal] == [0]
    reason = fatal[0]["reason"]
    for part in (f"subject '{subject}' version 1", "version 2", "qty", "default"):
        assert part in reason, (part, reason)

    pinned = decoder_for("avro", "value", {"version": 1}).prepare([topic_name], schemas)
    decoded = decode_frame(df, {"value": pinned})
    assert fatal_rows(decoded).count() == 0
    rows = sorted(query_rows(decoded).collect(), key=lambda r: r["kafka_offset"])
    assert [(r["id"], r["item"], r["coupon"]) for r in rows] == [(1, "a", "x"), (2, "b", None)]
    assert "qty" not in query_rows(decoded).columns  # read into the pinned version's columns


def test_json_from_the_registrys_json_schema_and_invalid_json(
    spark, kafka_broker, schema_registry, schema_registry_client, topic_name, monkeypatch
):
    bootstrap, client = kafka_broker.bootstrap, schema_registry_client
    _topic(bootstrap, topic_name)
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "price": {"type": ["number", "null"]},
        },
    }
    serialize = JSONSerializer(json.dumps(schema), client)
    records = [serialize({"id": i, "tags": [f"t{i}"], "price": i / 2}, _ctx(topic_name)) for i in range(3)]
    header = records[0][:5]
    records += [
        header + b"{not json",  # 3
        header + b'{"id": "three"}',  # 4: not the declared type
        b"\x00" + struct.pack(">I", 777777) + b'{"id": 5}',  # 5: an unknown id
        b'{"id": 6}',  # 6: no header
    ]
    _produce(bootstrap, topic_name, [(None, v) for v in records])
    spec = decoder_for("json", "value").prepare(
        [topic_name], _registry_conn(monkeypatch, schema_registry).schemas()
    )
    decoded = decode_frame(_read(spark, bootstrap, topic_name), {"value": spec}).persist()
    try:
        rows = _by_offset(query_rows(decoded).collect(), "kafka_offset")
        reasons = {r["offset"]: r["reason"] for r in bad_rows(decoded).collect()}
    finally:
        decoded.unpersist()
    assert {o: (r["id"], r["tags"], r["price"]) for o, r in rows.items()} == {
        0: (0, ["t0"], 0.0),
        1: (1, ["t1"], 0.5),
        2: (2, ["t2"], 1.0),
    }
    assert sorted(reasons) == [3, 4, 5, 6]
    assert reasons[3].startswith("value: invalid JSON") and reasons[4].startswith("value: invalid JSON")
    assert reasons[5].startswith("value: unknown schema id 777777 ")
    assert reasons[6].startswith("value: wrong magic byte 0x7b")


@pytest.mark.parametrize(
    "declared",
    [
        {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}},
        "id BIGINT, name STRING",
    ],
    ids=["json-schema", "spark-ddl"],
)
def test_json_with_a_schema_declared_in_the_pipelines_file(spark, kafka_broker, topic_name, declared):
    bootstrap = kafka_broker.bootstrap
    _topic(bootstrap, topic_name)
    values = [b'{"id": 1, "name": "a"}', b'{"id": 2}', b"[1, 2]", b"{oops", b'{"id": 3, "name": "c"}', None]
    _produce(bootstrap, topic_name, [(b"k", v) for v in values])
    spec = decoder_for("json", "value", {"schema": declared}).prepare([topic_name], None)
    decoded = decode_frame(_read(spark, bootstrap, topic_name), {"value": spec})
    rows = _by_offset(query_rows(decoded, keep_raw_value=True).collect(), "kafka_offset")
    assert {o: (r["id"], r["name"]) for o, r in rows.items()} == {
        0: (1, "a"),
        1: (2, None),
        4: (3, "c"),
        5: (None, None),
    }
    assert bytes(rows[0]["kafka_value"]) == values[0] and bytes(rows[0]["kafka_key"]) == b"k"
    reasons = {r["offset"]: r["reason"] for r in bad_rows(decoded).collect()}
    assert sorted(reasons) == [2, 3] and all(r.startswith("value: invalid JSON") for r in reasons.values())


@pytest.mark.parametrize("escaped", ["false", "true"])
def test_the_decoders_sql_literals_read_back_as_written_under_either_parser_setting(spark, escaped):
    """The decoders' expressions are SQL text (sql_text): a schema or reason with quotes,
    backslashes, non-ASCII or a newline must reach Spark exactly, whether or not the session reads
    backslashes in string literals as escapes (spark.sql.parser.escapedStringLiterals)."""
    texts = [
        "plain",
        "Confluent's",
        'a "quoted" word',
        "back\\slash \\n",
        "h\u00e9llo \u2603",
        "two\nlines",
        "",
    ]
    before = spark.conf.get("spark.sql.parser.escapedStringLiterals")
    spark.conf.set("spark.sql.parser.escapedStringLiterals", escaped)
    try:
        row = (
            spark.range(1)
            .selectExpr(
                *(f"{sql.string(t)} AS t{i}" for i, t in enumerate(texts)),
                f"{sql.binary(bytes([0, 1, 255]))} AS b",
                f"1 AS {sql.ident('odd `name`')}",
            )
            .collect()[0]
        )
    finally:
        spark.conf.set("spark.sql.parser.escapedStringLiterals", before)
    assert [row[f"t{i}"] for i in range(len(texts))] == texts
    assert row["b"] == bytearray([0, 1, 255]) and row["odd `name`"] == 1


def test_raw_leaves_kafkas_columns_as_they_are(spark, kafka_broker, topic_name):
    bootstrap = kafka_broker.bootstrap
    _topic(bootstrap, topic_name)
    _produce(bootstrap, topic_name, [(b"k", b"\x00anything"), (None, b"{")])
    df = _read(spark, bootstrap, topic_name)
    specs = {f: decoder_for("raw", f).prepare([topic_name], None) for f in ("key", "value")}
    decoded = decode_frame(df, specs)
    assert good_rows(decoded).collect() == df.collect()
    assert bad_rows(decoded).count() == 0
    assert query_rows(decoded).columns == ["value", *METADATA_COLUMNS.values()]


def test_the_same_decoding_over_spark_connect(
    spark_connect, kafka_broker, schema_registry, schema_registry_client, topic_name, monkeypatch
):
    """The connect engine's session (a Spark Connect client) builds the same expressions: from_avro
    runs in the server's JVM, with spark-avro on its classpath."""
    from pyspark.sql import SparkSession

    from airflow_kafka_backpressure.engines.connect import restored_environment

    bootstrap, client = kafka_broker.bootstrap, schema_registry_client
    _topic(bootstrap, topic_name)
    v1, v2 = AvroSerializer(client, json.dumps(V1)), AvroSerializer(client, json.dumps(V2))
    first = v1({"id": 1, "item": "a"}, _ctx(topic_name))
    _produce(
        bootstrap,
        topic_name,
        [
            (None, first),
            (None, v2({"id": 2, "item": "b", "coupon": "c"}, _ctx(topic_name))),
            (None, first[:5] + b"\x80"),
        ],
    )
    spec = decoder_for("avro", "value").prepare(
        [topic_name], _registry_conn(monkeypatch, schema_registry).schemas()
    )
    with restored_environment():
        session = SparkSession.builder.remote(spark_connect.url).create()
        try:
            assert decoder_for("avro", "value").session_problem(session) is None
            decoded = decode_frame(_read(session, bootstrap, topic_name), {"value": spec})
            rows = sorted(query_rows(decoded).collect(), key=lambda r: r["kafka_offset"])
            errors = bad_rows(decoded).collect()
        finally:
            session.stop()
    assert [(r["id"], r["item"], r["coupon"]) for r in rows] == [(1, "a", None), (2, "b", "c")]
    assert [(e["offset"], e["reason"].split(":")[1].strip()) for e in errors] == [(2, "corrupt payload")]
