"""Typed records end to end: the shipped DAGs under real Airflow (``dag.test()``), the session's
Apache Kafka broker, both engines (spark-submit on ``local[2]``, the session's Spark Connect server),
records encoded by confluent-kafka's own ``AvroSerializer`` against the tests' Schema Registry.

What stands in: the Schema Registry is the test suite's server of Confluent's REST API
(:mod:`kbp_local.schema_registry`) — no Confluent registry can be installed here (not on PyPI, Maven
Central or Debian's packages); the bytes on the topic are the real wire format, written by
confluent-kafka's serializers, and the product reads the registry through confluent-kafka's client.

Read back without Spark and without the product's code: the Parquet directory with pyarrow (each
batch's ``batch_id=<N>/`` and its ``_errors/``), the Delta tables with ``deltalake`` (delta-rs).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from . import airflow_harness as af
from .test_record_decoders import V1, V2, V3, _registry_conn


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def _registry_connection(monkeypatch, registry) -> str:
    return _registry_conn(monkeypatch, registry).schema_registry_conn_id


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, value in enumerate(values):
        producer.produce(topic, key=f"k{i}".encode(), value=value)
    assert producer.flush(30) == 0


def _parquet_rows(sink: str, batch_id: int, errors: bool = False) -> list[dict[str, Any]]:
    path = Path(sink) / f"batch_id={batch_id}"
    if errors:
        path = path / "_errors"
        if not path.exists():
            return []
    return ds.dataset(str(path), format="parquet").to_table().to_pylist()


def _delta_rows(path: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    if not (Path(path) / "_delta_log").exists():
        return []
    return DeltaTable(path).to_pyarrow_table().to_pylist()


class Output:
    """The sink's rows and error rows as an independent reader sees them."""

    def __init__(self, sink: str, fmt: str) -> None:
        self.sink, self.fmt = sink, fmt

    def rows(self) -> list[dict[str, Any]]:
        if self.fmt == "delta":
            return _delta_rows(self.sink)
        root = Path(self.sink)
        batches = sorted(int(d.name.split("=")[1]) for d in root.glob("batch_id=*")) if root.exists() else []
        return [{**r, "kbp_batch_id": b} for b in batches for r in _parquet_rows(self.sink, b)]

    def errors(self) -> list[dict[str, Any]]:
        if self.fmt == "delta":
            return _delta_rows(self.sink + "_errors")
        root = Path(self.sink)
        batches = sorted(int(d.name.split("=")[1]) for d in root.glob("batch_id=*")) if root.exists() else []
        return [{**r, "kbp_batch_id": b} for b in batches for r in _parquet_rows(self.sink, b, errors=True)]


@pytest.mark.parametrize("engine, sink_format", [("submit", "parquet"), ("connect", "delta")])
def test_avro_records_land_typed_and_bad_ones_once_in_the_error_table(
    request,
    engine,
    sink_format,
    kafka_broker,
    topic_name,
    schema_registry,
    schema_registry_client,
    tmp_path,
    monkeypatch,
    airflow_db,
):
    """Avro values through the registry: a failed batch and its replay, a compatible schema change
    mid-run (the newer field lands as a column; Delta's table gains it), corrupt, unknown-id and
    not-Avro records set aside once each, then an incompatible change that fails the batch naming the
    subject, both versions and the field, with nothing written."""
    bootstrap, client = kafka_broker.bootstrap, schema_registry_client
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    make = af.engine_pipeline_maker(request, engine, monkeypatch, bootstrap, topic_name, tmp_path)
    sink = str(tmp_path / "sink")
    p, ledger = make(
        sink=sink,
        sink_format=sink_format,
        value_format="avro",
        schema_registry_conn_id=_registry_connection(monkeypatch, schema_registry),
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )
    out = Output(sink, sink_format)
    subject = f"{topic_name}-value"
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    v1, v2 = AvroSerializer(client, json.dumps(V1)), AvroSerializer(client, json.dumps(V2))

    # batch 1: ten v1 records and three bad ones
    first = [v1({"id": i, "item": f"i{i}"}, ctx) for i in range(10)]
    v1_id = client.get_version(subject, 1).schema_id
    bad1 = [
        b"\x00" + struct.pack(">I", v1_id) + b"\xff\xff\xff",  # corrupt payload
        b"\x00" + struct.pack(">I", 777777) + first[0][5:],  # a schema id nobody registered
        b'{"id": 99, "item": "json"}',  # not the wire format
    ]
    _produce(bootstrap, topic_name, first + bad1)
    flag.touch()
    failed = af.run_dag(p.ingest_dag_id, 0)
    assert failed.task_states["ingest"] == "failed", failed.task_states
    assert out.rows() == [] and out.errors() == []  # neither table got anything of the failed batch
    flag.unlink()
    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states

    # batch 2: the producer moves to v2 (registered now, after batch 1 was planned), one more corrupt
    second = [v2({"id": i, "item": f"i{i}", "coupon": f"c{i}"}, ctx) for i in range(10, 15)]
    v2_id = client.get_version(subject, 2).schema_id
    _produce(bootstrap, topic_name, [*second, b"\x00" + struct.pack(">I", v2_id) + b"\x80"])
    ok = af.run_dag(p.ingest_dag_id, 1)
    assert ok.state == "success", ok.task_states
    assert ok.xcoms["ingest"]["records"] == 6 and ok.xcoms["ingest"]["bad_records"] == 1
    assert ledger.batch(1).bad_records == 3 and ledger.batch(2).bad_records == 1

    rows = out.rows()
    assert Counter(r["id"] for r in rows) == Counter(range(15))  # each good record once
    by_id = {r["id"]: r for r in rows}
    assert by_id[3]["item"] == "i3" and by_id[12]["coupon"] == "c12"
    if sink_format == "delta":  # one table: v1's rows read with the newer column, null
        assert by_id[3]["coupon"] is None
    else:  # a directory per batch, each in the reader schema it was decoded with
        assert "coupon" not in by_id[3]
    # Kafka's metadata under its fixed names; no raw value unless asked
    assert {"kafka_key", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp"} <= set(rows[0])
    assert "kafka_value" not in rows[0] and "value" not in rows[0]
    assert {r["kafka_topic"] for r in rows} == {topic_name}

    errors = out.errors()
    kinds = Counter(e["reason"].split(":")[1].split(" (")[0].strip() for e in errors)
    expected_kinds = {"corrupt payload": 2, "unknown schema id 777777": 1, "wrong magic byte 0x7b": 1}
    assert kinds == Counter(expected_kinds), sorted(e["reason"] for e in errors)
    assert len(errors) == 4
    assert Counter((e["topic"], e["partition"], e["offset"]) for e in errors).most_common(1)[0][1] == 1
    assert sorted(e["value"] for e in errors) == sorted([*bad1, b"\x00" + struct.pack(">I", v2_id) + b"\x80"])

    # an incompatible change: v3 registered (the subject's check turned off, as a careless deploy
    # would), the old producers still write v2; the batch reads into the latest, v3, and cannot
    client.set_compatibility(subject, "NONE")
    AvroSerializer(client, json.dumps(V3))({"id": 100, "item": "x", "coupon": None, "qty": 1}, ctx)
    _produce(bootstrap, topic_name, [v2({"id": 200, "item": "old", "coupon": None}, ctx)])
    before = (out.rows(), out.errors())
    broken = af.run_dag(p.ingest_dag_id, 2)
    assert broken.task_states["ingest"] == "failed", broken.task_states
    message = ledger.batch(3).error or ""
    assert "incompatible schema" in message and f"{subject!r} version 2" in message, message
    assert f"{subject!r} version 3" in message and "qty" in message, message
    assert (out.rows(), out.errors()) == before  # nothing of the batch written


@pytest.mark.parametrize("engine, sink_format", [("submit", "delta"), ("connect", "parquet")])
def test_json_with_a_declared_schema_and_the_bad_record_bound(
    request, engine, sink_format, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    """JSON text into a schema declared in the pipelines file (no registry). Two of six records do
    not fit it: above ``max_bad_records = 1`` the batch fails naming the first bad offsets, and
    nothing of it is committed; with the bound raised to a share (0.5), its replay lands the four good
    records in typed columns and the two bad ones in the error table, once each."""
    from .test_delta_pipeline import delta_conf

    bootstrap = kafka_broker.bootstrap
    make = af.engine_pipeline_maker(request, engine, monkeypatch, bootstrap, topic_name, tmp_path)
    sink = str(tmp_path / "sink")
    settings = {
        "sink": sink,
        "sink_format": sink_format,
        "spark_conf": delta_conf() if (engine, sink_format) == ("submit", "delta") else {},
        "value_format": "json",
        "value_options": {"schema": "id BIGINT, item STRING, price DOUBLE"},
        "keep_raw_value": True,
        "replay_interval_s": 20,
    }
    p, ledger = make(**settings, max_bad_records=1)
    out = Output(sink, sink_format)
    good = [json.dumps({"id": i, "item": f"i{i}", "price": i / 2}).encode() for i in range(4)]
    bad = [b'{"id": 4, "item": ', b'{"id": "five", "item": "i5"}']
    _produce(bootstrap, topic_name, good + bad)

    failed = af.run_dag(p.ingest_dag_id, 0)
    assert failed.task_states["ingest"] == "failed", failed.task_states
    message = ledger.batch(1).error or ""
    assert "2 of 6 records did not decode, more than max_bad_records = 1" in message, message
    assert message.count("invalid JSON") == 2 and f"{topic_name}-" in message, message
    assert out.rows() == [] and out.errors() == []

    p, _ = make(**settings, max_bad_records=0.5)
    replay = af.run_dag(p.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states
    assert ledger.batch(1).bad_records == 2

    rows = sorted(out.rows(), key=lambda r: r["id"])
    assert [(r["id"], r["item"], r["price"]) for r in rows] == [(i, f"i{i}", i / 2) for i in range(4)]
    assert [r["kafka_value"] for r in rows] == good  # keep_raw_value
    errors = out.errors()
    assert sorted(e["value"] for e in errors) == sorted(bad)
    assert all(e["reason"].startswith("value: invalid JSON") for e in errors), errors


def test_the_job_gets_schema_text_and_never_the_registry_or_its_password(
    topic_name, schema_registry, schema_registry_client, monkeypatch
):
    """What the worker hands the Spark job for a decoded pipeline (``SparkBatchHook.decoding``, the
    spec's ``decoding``): schema text and ids read from the registry with the connection's
    credentials, and neither the registry's URL nor its user or password."""
    from airflow_kafka_backpressure.batch.models import BatchPlan, OffsetRange
    from airflow_kafka_backpressure.config.pipeline import PipelineConfig
    from airflow_kafka_backpressure.hooks.spark_batch import SparkBatchHook

    subject = f"{topic_name}-value"
    AvroSerializer(schema_registry_client, json.dumps(V1))(
        {"id": 1, "item": "a"}, SerializationContext(topic_name, MessageField.VALUE)
    )
    p = PipelineConfig(
        name="typed",
        topics=[topic_name],
        sink="/tmp/typed-sink",
        value_format="avro",
        schema_registry_conn_id=_registry_connection(monkeypatch, schema_registry),
    )
    plan = BatchPlan("typed", 1, "run", (OffsetRange(topic_name, 0, 0, 1),), p.sink, 60_000, 0)
    decoding = SparkBatchHook(p).decoding(plan)
    assert decoding is not None
    text = json.dumps(decoding.to_dict())
    reader = decoding.specs["value"].resolved["reader"]
    assert reader["subject"] == subject
    assert [f["name"] for f in json.loads(reader["schema"])["fields"]][:2] == ["id", "item"]
    user, password = schema_registry.auth
    for secret in (password, user, schema_registry.url, "127.0.0.1"):
        assert secret not in text
