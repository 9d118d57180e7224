"""Credentials among a Kafka connection's properties (pure): references to secrets kept on the
hosts, JAAS quoting, the secret properties, Spark's connector options for mutual TLS."""

from __future__ import annotations

import base64

import pytest

from airflow_kafka_backpressure.kafka.config import (
    KafkaConfigError,
    to_confluent,
    to_kafka_python,
    to_spark_kafka_options,
)
from airflow_kafka_backpressure.kafka.credentials import (
    Reference,
    jaas_quoted,
    java_key_problem,
    literal_secrets,
    reference,
    resolved,
)

BASE = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}


def test_references_in_kafkas_config_provider_syntax_are_parsed_and_plain_values_are_not():
    assert reference("${dir:/var/run/secrets/kafka:password}") == Reference(
        "dir", "/var/run/secrets/kafka", "password"
    )
    assert reference("${env:KAFKA_PASSWORD}") == Reference("env", None, "KAFKA_PASSWORD")
    assert str(reference("${dir:/a/b:c}")) == "${dir:/a/b:c}"
    for plain in ("pw", "a${b}c", "${not a reference", 42, None, "x${dir:/a:b}"):
        assert reference(plain) is None


@pytest.mark.parametrize(
    "value,named",
    [
        ("${file:/etc/k.properties:pw}", "only ${dir:"),
        ("${dir:password}", "${dir:/path/to/dir:file}"),
        ("${env:/x:Y}", "${env:NAME}"),
    ],
)
def test_a_reference_of_an_unknown_provider_or_shape_is_refused_naming_the_property(value, named):
    with pytest.raises(KafkaConfigError) as e:
        reference(value, name="sasl.password", source="Kafka connection 'k'")
    assert (
        "Kafka connection 'k'" in str(e.value) and "'sasl.password'" in str(e.value) and named in str(e.value)
    )


def test_references_resolve_to_the_files_content_or_the_variable_as_kafka_reads_them(tmp_path, monkeypatch):
    (tmp_path / "pw").write_text("s3cret\n")  # a trailing line break is part of the value, as in Kafka
    monkeypatch.setenv("KBP_TEST_KEY_PASSWORD", "k3y")
    props = {
        **BASE,
        "sasl.password": f"${{dir:{tmp_path}:pw}}",
        "ssl.key.password": "${env:KBP_TEST_KEY_PASSWORD}",
    }
    assert resolved(props) == {**props, "sasl.password": "s3cret\n", "ssl.key.password": "k3y"}
    assert to_kafka_python(props)["sasl_plain_password"] == "s3cret\n"
    assert to_confluent(props)["ssl.key.password"] == "k3y"


def test_a_reference_that_cannot_be_resolved_here_names_the_file_or_variable_and_the_fix(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("KBP_TEST_MISSING", raising=False)
    with pytest.raises(KafkaConfigError, match=r"the file .*/missing.*cannot be read on this host"):
        to_kafka_python(
            {**BASE, "sasl.password": f"${{dir:{tmp_path}:missing}}"}, source="Kafka connection 'k'"
        )
    with pytest.raises(KafkaConfigError, match="environment variable 'KBP_TEST_MISSING'.*not set"):
        to_kafka_python({**BASE, "sasl.password": "${env:KBP_TEST_MISSING}"})


def test_the_native_options_pass_references_on_with_the_providers_that_resolve_them():
    opts = to_spark_kafka_options(
        {
            **BASE,
            "sasl.username": "svc",
            "sasl.password": "${dir:/run/secrets:pw}",
            "ssl.key.password": "${env:KP}",
        }
    )
    assert opts["kafka.sasl.jaas.config"].endswith('username="svc" password="${dir:/run/secrets:pw}";')
    assert opts["kafka.ssl.key.password"] == "${env:KP}"
    assert opts["kafka.config.providers"] == "dir,env"
    assert (
        opts["kafka.config.providers.dir.class"]
        == "org.apache.kafka.common.config.provider.DirectoryConfigProvider"
    )
    assert (
        opts["kafka.config.providers.env.class"]
        == "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
    )
    assert "kafka.config.providers" not in to_spark_kafka_options(
        {**BASE, "sasl.username": "u", "sasl.password": "p"}
    )


@pytest.mark.parametrize(
    "value,quoted",
    [
        ("plain", '"plain"'),
        ("pa\\ss", '"pa\\\\ss"'),
        ('ab"cd', '"ab\\"cd"'),
        ("a\nb\rc", '"a\\nb\\rc"'),
        ("x; y=z", '"x; y=z"'),
    ],
)
def test_jaas_values_are_quoted_with_the_escapes_kafkas_tokenizer_undoes(value, quoted):
    assert jaas_quoted(value) == quoted


def test_the_secret_properties_given_as_values_are_told_apart_from_references():
    props = {**BASE, "sasl.username": "u", "sasl.password": "pw", "ssl.key.password": "${env:KP}"}
    assert literal_secrets(props) == {"sasl.password": "pw"}
    assert literal_secrets(BASE) == {}


def test_a_client_certificate_in_two_files_is_a_pem_keystore_read_through_the_directory_provider():
    opts = to_spark_kafka_options(
        {
            "bootstrap.servers": "b:1",
            "security.protocol": "SSL",
            "ssl.certificate.location": "/tls/c.pem",
            "ssl.key.location": "/keys/k.pem",
            "ssl.key.password": "kp",
        }
    )
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert opts["kafka.ssl.keystore.certificate.chain"] == "${dir:/tls:c.pem}"
    assert opts["kafka.ssl.keystore.key"] == "${dir:/keys:k.pem}"
    assert opts["kafka.ssl.key.password"] == "kp"
    assert opts["kafka.config.providers"] == "dir"
    assert not any(k in opts for k in ("kafka.ssl.certificate.location", "kafka.ssl.key.location"))
    one_file = to_spark_kafka_options(
        {
            "bootstrap.servers": "b:1",
            "ssl.certificate.location": "/tls/both.pem",
            "ssl.key.location": "/tls/both.pem",
        }
    )
    assert (
        one_file["kafka.ssl.keystore.location"] == "/tls/both.pem"
        and "kafka.config.providers" not in one_file
    )


def test_half_a_client_certificate_or_a_relative_path_is_refused_with_what_is_missing():
    with pytest.raises(
        KafkaConfigError, match="'ssl.certificate.location' is set but 'ssl.key.location' is not"
    ):
        to_spark_kafka_options({"bootstrap.servers": "b:1", "ssl.certificate.location": "/c.pem"})
    with pytest.raises(KafkaConfigError, match="must be an absolute path"):
        to_spark_kafka_options(
            {"bootstrap.servers": "b:1", "ssl.certificate.location": "c.pem", "ssl.key.location": "/k/k.pem"}
        )


def _encrypted_pem(der: bytes) -> str:
    body = base64.encodebytes(der).decode()
    return f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{body}-----END ENCRYPTED PRIVATE KEY-----\n"


def test_a_pbes2_encrypted_key_is_told_apart_for_javas_client(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pbes2 = tmp_path / "pbes2.pem"
    pbes2.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    plain = tmp_path / "plain.pem"
    plain.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    problem = java_key_problem(pbes2)
    assert problem and "PBES2" in problem and "PBE-SHA1-3DES" in problem and str(pbes2) in problem
    assert java_key_problem(plain) is None
    assert java_key_problem(tmp_path / "not-here.pem") is None  # another host's path: not checked here
    # PBES1 (pbeWithSHA1And3-KeyTripleDES-CBC's OID) is fine
    pbes1 = tmp_path / "pbes1.pem"
    pbes1.write_text(_encrypted_pem(bytes.fromhex("3081b1301c060a2a864886f70d010c0103300e") + b"\0" * 40))
    assert java_key_problem(pbes1) is None
