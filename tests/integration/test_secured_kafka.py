"""The pipeline against Kafka as production secures it: SASL/SCRAM-SHA-512 over TLS.

The session's Apache Kafka has a SASL_SSL listener (a throw-away CA made by the fixture; SCRAM users
created through Kafka's Admin API). Each test creates its own user and gives the shipped DAGs only
the secured listener, in the official Kafka provider's connection format (librdkafka properties in
the extra: ``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
``ssl.ca.location``). Planning, the Spark job's reader (Spark's own connector, or the Python reader),
the group commit and the lag sensor's trigger all authenticate through it. On the connect engine,
Spark's own reader gets the password as a reference to a file on the hosts (``${dir:…}``): the engine
puts no credential into a Spark Connect plan, and a password given as a value is refused for that
reader with what to do. The planted-secret test (``test_secrets_never_leak``) runs both engines and
both readers against the same listener.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter

import pytest

from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from kbp_local.producer import produce

from . import airflow_harness as af
from .test_pipeline_e2e import sink_ids


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def scram_user(kafka_broker):
    """A new SCRAM-SHA-512 user of the secured listener: its client properties."""
    name, password = f"kbp-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    kafka_broker.add_scram_user(name, password)
    return kafka_broker.secured_client_properties(name, password)


def _group_offsets(props, p) -> int:
    with KafkaOffsets(props, source="the test") as k:
        return sum(k.committed_offsets(p.group, k.partitions(p.topics)).values())


@pytest.mark.parametrize(
    "engine,reader",
    [("connect", "native"), ("connect", "python"), ("submit", "python")],
    ids=["connect-native", "connect-python", "submit-python"],
)
def test_a_secured_pipeline_ingests_fails_and_replays_exactly_once(
    engine, reader, request, kafka_broker, scram_user, topic_name, tmp_path, monkeypatch, airflow_db
):
    connect_url = request.getfixturevalue("spark_connect").url if engine == "connect" else None
    if (engine, reader) == ("connect", "native"):  # Spark's connector reads the password on the hosts
        secret_dir = tmp_path / "host-secrets"
        secret_dir.mkdir()
        (secret_dir / "password").write_text(scram_user["sasl.password"])
        scram_user = {**scram_user, "sasl.password": f"${{dir:{secret_dir}:password}}"}
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    make = af.pipeline_maker(
        monkeypatch,
        kafka_broker.bootstrap,
        topic_name,
        tmp_path,
        connect_url=connect_url,
        kafka_extra=scram_user,
        engine=engine,
        reader=reader,
    )
    p, ledger = make(transform="tests.integration.e2e_transforms:fail_while_flagged", replay_interval_s=20)

    def after_failure(failed) -> None:
        assert failed.task_states["plan"] == "success", failed.task_states  # planned through SASL_SSL
        assert _group_offsets(scram_user, p) == 0  # nothing committed past a failed batch

    af.fail_replay_then_ingest(p, kafka_broker.bootstrap, flag, after_failure=after_failure)

    assert sink_ids(p.sink) == Counter(range(60))  # every record once
    assert _group_offsets(scram_user, p) == 60  # the group commit authenticated too
    assert [ledger.batch(1).status, ledger.batch(2).status] == ["replayed", "succeeded"]

    if engine == "connect" and reader == "native":
        # the lag sensor's trigger (as the triggerer runs it) authenticates with the same connection
        from airflow_kafka_backpressure.sensors.kafka_lag import KafkaLagSensor

        produce(kafka_broker.bootstrap, topic_name, count=8, partitions=4, start_id=60)
        trigger = KafkaLagSensor(task_id="lag", pipeline=p, max_lag_records=1, poke_interval=0.2).trigger(
            None
        )

        async def first_event():
            async for event in trigger.run():
                return event.payload

        event = asyncio.run(first_event())
        assert event["status"] == "found" and event["report"]["total_lag"] == 8, event


def test_a_wrong_password_fails_the_plan_naming_the_connection_and_mechanism_and_nothing_advances(
    kafka_broker, scram_user, topic_name, tmp_path, monkeypatch, airflow_db
):
    from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook
    from airflow_kafka_backpressure.kafka.offsets import KafkaUnavailableError

    wrong = {**scram_user, "sasl.password": "not-" + scram_user["sasl.password"]}
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path, kafka_extra=wrong)
    p, ledger = make(engine="connect", kafka_timeout_s=5)
    produce(kafka_broker.bootstrap, topic_name, count=12, partitions=4)
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.task_states["plan"] == "failed", r.task_states
    assert r.task_states["ingest"] != "success"
    assert ledger.recent_batches(p.name, 10) == []  # no batch planned
    assert _group_offsets(scram_user, p) == 0  # nothing committed
    assert not sink_ids(p.sink)

    # what the plan task raised: the hook it plans with, on the same connection
    with pytest.raises(KafkaUnavailableError) as refused:
        with KafkaOffsetsHook("kafka_default", timeout_s=5).get_conn() as client:
            client.partitions(p.topics)
    message = str(refused.value)
    assert "Kafka connection 'kafka_default'" in message and "sasl.mechanism SCRAM-SHA-512" in message
    assert f"user {scram_user['sasl.username']!r}" in message and "sasl.password" in message
    assert wrong["sasl.password"] not in message  # the message names the fix, never the password


def test_spark_readers_connector_on_the_connect_engine_refuses_a_password_given_as_a_value(
    request, kafka_broker, scram_user, topic_name, tmp_path, monkeypatch, airflow_db
):
    """reader='native' on the connect engine with ``sasl.password`` written in the connection: the
    batch fails before anything is read, saying why and the two ways out; nothing is committed."""
    make = af.pipeline_maker(
        monkeypatch,
        kafka_broker.bootstrap,
        topic_name,
        tmp_path,
        connect_url=request.getfixturevalue("spark_connect").url,
        kafka_extra=scram_user,
        engine="connect",
        reader="native",
    )
    p, ledger = make()
    produce(kafka_broker.bootstrap, topic_name, count=12, partitions=4)
    r = af.run_dag(p.ingest_dag_id, 0)
    assert r.task_states["plan"] == "success" and r.task_states["ingest"] == "failed", r.task_states
    error = ledger.batch(1).error or ""
    assert "reader='native' cannot read this batch on the connect engine" in error, error
    assert "${dir:" in error and "'auto' or 'python'" in error
    assert scram_user["sasl.password"] not in error
    assert _group_offsets(scram_user, p) == 0 and not sink_ids(p.sink)


def test_a_changed_password_reaches_the_next_batch_through_a_new_connect_session(
    spark_connect, kafka_broker, scram_user, topic_name, tmp_path
):
    """The connect engine keeps a pipeline's server session between batches, and the session keeps
    the file of the Kafka credentials it was first given: after the password changes, the next
    batch's credentials are refused by that session and the batch runs in a new one."""
    import json

    from airflow_kafka_backpressure.batch.models import JobSpec
    from airflow_kafka_backpressure.engines.connect import ConnectEngine
    from kbp_local.producer import ensure_topic

    from .test_spark_job import make_spec

    ensure_topic(kafka_broker.bootstrap, topic_name, 4)
    produce(kafka_broker.bootstrap, topic_name, count=8, partitions=4)
    sessions = tmp_path / "work" / "connect-sessions.json"

    def batch(batch_id: int, props: dict, ranges: dict):
        spec = make_spec(
            tmp_path, kafka_broker.bootstrap, batch_id, ranges, sink=tmp_path / "sink", kafka=props
        )
        spec = JobSpec.from_dict({**spec.to_dict(), "reader": "python"})
        return ConnectEngine(spark_connect.url, work_root=tmp_path / "work").run(spec)

    first = batch(1, scram_user, {(topic_name, p): (0, 1) for p in range(4)})
    assert first.records == 4
    (kept,) = json.loads(sessions.read_text()).values()

    new_password = scram_user["sasl.password"] + "-rotated"
    kafka_broker.add_scram_user(scram_user["sasl.username"], new_password)
    second = batch(
        2, {**scram_user, "sasl.password": new_password}, {(topic_name, p): (1, 2) for p in range(4)}
    )
    assert second.records == 4
    (renewed,) = json.loads(sessions.read_text()).values()
    assert renewed != kept
