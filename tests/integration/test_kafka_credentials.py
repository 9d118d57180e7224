"""Kafka credentials as users write them, on the session's Apache Kafka, through both readers.

* **SASL passwords with the characters JAAS treats specially** (``\\``, ``"``, ``;``, ``=``, spaces):
  Spark's Kafka connector takes SASL credentials only as a JAAS configuration string, which Kafka's
  Java client parses; a SCRAM user with each such password reads its batch exactly, with Spark's
  connector and with the Python reader (whose clients take the password as it is).
* **Client certificates (mutual TLS)**: the session broker's ``MTLS`` listener asks every client
  for a certificate signed by its CA; a connection written as librdkafka's properties
  (``ssl.certificate.location``, ``ssl.key.location`` and ``ssl.key.password`` for an encrypted
  PKCS#8 key, the certificate and the key in two files) reads its batch with both readers. A key
  encrypted by PBES2 (OpenSSL's default), which Kafka's Java client cannot decrypt, is refused for
  Spark's connector with the command that converts it, and read by the Python reader.
* **A password kept on the hosts** (``${dir:…}``): the planner and both readers read it from the
  file, and the native reader's options name the file, never the password.

Each batch runs through :func:`run_batch` in the session's local[2] Spark (with Spark's Kafka
connector) and is read back from the sink with pyarrow.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import JobSpec, TopicPartition
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.spark.job import JobError, run_batch
from airflow_kafka_backpressure.spark.readers import native_options
from kbp_local.producer import produce

from .test_reader_agreement import sink_rows
from .test_spark_job import make_spec

READERS = ["native", "python"]
RECORDS = 12


@pytest.fixture(scope="module")
def topic(kafka_broker) -> str:
    """One partition with RECORDS records, produced on the plaintext listener."""
    name = f"credentials-{secrets.token_hex(3)}"
    produce(kafka_broker.bootstrap, name, count=RECORDS, partitions=1)
    return name


def read_back(spark, tmp_path: Path, topic: str, reader: str, kafka: dict) -> list[int]:
    """Run one batch of the whole partition with ``kafka`` as the connection's properties; the
    offsets that landed in the sink."""
    sink = tmp_path / f"sink-{reader}"
    spec = make_spec(
        tmp_path,
        kafka["bootstrap.servers"],
        1,
        {(topic, 0): (0, RECORDS)},
        sink=sink,
        kafka=kafka,
        options={"writer": "spark"},
    )
    spec = JobSpec.from_dict({**spec.to_dict(), "reader": reader})
    metrics = run_batch(spark, spec)
    assert metrics.records == RECORDS
    return [offset for offset, _, _ in sink_rows(sink)]


PASSWORDS = {
    "backslash": "pa\\ss",
    "quote": 'ab"cd',
    "quote-and-option": 'x" evil="y',
    "semicolon-equals-spaces": "one; two = three  four",
    "all-of-them": 'a\\"b;c= "d\\\\',
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("password", list(PASSWORDS.values()), ids=list(PASSWORDS))
def test_a_sasl_password_with_jaas_special_characters_reads_the_batch(
    spark, kafka_broker, topic, tmp_path, reader, password
):
    user = f"kbp-jaas-{secrets.token_hex(3)}"
    kafka_broker.add_scram_user(user, password)
    props = kafka_broker.secured_client_properties(user, password)

    assert read_back(spark, tmp_path, topic, reader, props) == list(range(RECORDS))


def test_the_jaas_string_holds_the_password_as_kafka_reads_it():
    """Kafka's parser (java.io.StreamTokenizer) reads ``\\x`` as ``x`` in a quoted string and
    ends it at ``"``: the password goes in escaped, and nothing after it is a login option."""
    props = {"bootstrap.servers": "h:1", "sasl.username": 'u"1', "sasl.password": 'x" evil="y\\'}
    jaas = native_options_for(props)["kafka.sasl.jaas.config"]
    assert jaas.endswith(' required username="u\\"1" password="x\\" evil=\\"y\\\\";')


def native_options_for(props: dict) -> dict:
    spec = make_spec(Path("/nowhere"), "h:1", 1, {("t", 0): (0, 1)}, sink=Path("/nowhere"), kafka=props)
    return native_options(spec)


@pytest.mark.parametrize(
    "reader,encryption",
    [("native", "pbes1"), ("python", "pbes1"), ("python", "pbes2"), ("native", None), ("python", None)],
)
def test_a_client_certificate_reads_the_batch_over_mutual_tls(
    spark, kafka_broker, topic, tmp_path, reader, encryption
):
    props = kafka_broker.mtls_client_properties(
        tmp_path / "client-tls",
        f"kbp-client-{reader}",
        key_password=secrets.token_urlsafe(12) if encryption else None,
        key_encryption=encryption or "pbes2",
    )
    assert (
        props["ssl.certificate.location"] != props["ssl.key.location"]
    )  # two files, as librdkafka takes them
    assert ("ssl.key.password" in props) == bool(encryption)

    assert read_back(spark, tmp_path, topic, reader, props) == list(range(RECORDS))


def test_a_pbes2_encrypted_client_key_is_refused_for_the_native_reader_with_the_fix(
    spark, kafka_broker, topic, tmp_path
):
    props = kafka_broker.mtls_client_properties(
        tmp_path / "client-tls", "kbp-client-pbes2", key_password=secrets.token_urlsafe(12)
    )
    with pytest.raises(JobError) as refused:
        read_back(spark, tmp_path, topic, "native", props)
    message = str(refused.value)
    assert props["ssl.key.location"] in message and "PBES2" in message
    assert "openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES" in message and "reader 'python'" in message
    assert props["ssl.key.password"] not in message


def test_the_mutual_tls_listener_refuses_a_client_without_a_certificate(kafka_broker, topic):
    """The listener really asks for the certificate: without one nothing is read."""
    from airflow_kafka_backpressure.kafka.offsets import KafkaUnavailableError

    props = {
        "bootstrap.servers": kafka_broker.mtls_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(kafka_broker.ca_path),
    }
    with pytest.raises(KafkaUnavailableError), KafkaOffsets(props, timeout_s=5) as client:
        client.latest_offsets([TopicPartition(topic, 0)])


@pytest.mark.parametrize("reader", READERS)
def test_a_password_kept_in_a_file_on_the_hosts_reads_the_batch_and_stays_out_of_the_options(
    spark, kafka_broker, topic, tmp_path, reader
):
    user, password = f"kbp-ref-{secrets.token_hex(3)}", f"pw-{secrets.token_hex(8)}"
    kafka_broker.add_scram_user(user, password)
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    (secret_dir / "kafka-password").write_text(password)  # no line break: Kafka reads the file as it is
    props = {
        **kafka_broker.secured_client_properties(user, password),
        "sasl.password": f"${{dir:{secret_dir}:kafka-password}}",
    }

    with KafkaOffsets(props, timeout_s=10) as client:  # the planner's client reads the file too
        assert client.latest_offsets([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): RECORDS}
    assert password not in repr(native_options_for(props))
    assert read_back(spark, tmp_path, topic, reader, props) == list(range(RECORDS))
