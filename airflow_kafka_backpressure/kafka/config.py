"""Kafka client properties → kafka-python arguments, → confluent-kafka configuration, and → Spark's
native ``kafka.*`` options.

Connections use the format of apache-airflow-providers-apache-kafka: the connection's extra JSON
holds librdkafka-style properties (``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``ssl.ca.location`` …). The bounded Spark job receives the
same properties and converts them itself, so one set of settings serves the planner, the Python
reader (with either client) and Spark's own Kafka connector.

Both clients accept the same whitelist of properties (:data:`SUPPORTED_PROPERTIES`); an unknown
key is refused with the list, whichever client is used, so a connection that works with one client
works with the other. librdkafka takes the properties by their own names (a few Java-style names
are renamed: ``request.timeout.ms`` → ``socket.timeout.ms``, ``fetch.max.wait.ms`` →
``fetch.wait.max.ms``, ``receive.buffer.bytes`` → ``socket.receive.buffer.bytes``,
``send.buffer.bytes`` → ``socket.send.buffer.bytes``). A few librdkafka fetch-tuning properties
(:data:`LIBRDKAFKA_ONLY`, e.g. ``queued.max.messages.kbytes``) have no kafka-python equivalent:
kafka-python and Spark's connector leave them out.

Pure Python: no Airflow, Spark or Kafka imports.
"""

from __future__ import annotations

from typing import Any

from .credentials import PROVIDER_CLASSES, jaas_quoted, java_key_problem, reference, resolved
from .errors import KafkaConfigError

__all__ = [
    "LIBRDKAFKA_ONLY",
    "SUPPORTED_PROPERTIES",
    "KafkaConfigError",
    "redact",
    "to_confluent",
    "to_kafka_python",
    "to_spark_kafka_options",
]


# librdkafka / Java property -> (kafka-python argument, converter)
def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


_TO_PYTHON: dict[str, tuple[str, Any]] = {
    "bootstrap.servers": ("bootstrap_servers", str),
    "security.protocol": ("security_protocol", lambda v: str(v).upper()),
    "sasl.mechanism": ("sasl_mechanism", lambda v: str(v).upper()),
    "sasl.mechanisms": ("sasl_mechanism", lambda v: str(v).upper()),
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", str),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", str),
    "ssl.ca.location": ("ssl_cafile", str),
    "ssl.certificate.location": ("ssl_certfile", str),
    "ssl.key.location": ("ssl_keyfile", str),
    "ssl.key.password": ("ssl_password", str),
    "ssl.crl.location": ("ssl_crlfile", str),
    "ssl.endpoint.identification.algorithm": ("ssl_check_hostname", lambda v: str(v).lower() == "https"),
    "client.id": ("client_id", str),
    "request.timeout.ms": ("request_timeout_ms", int),
    "socket.connection.setup.timeout.ms": ("bootstrap_timeout_ms", int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
    "receive.buffer.bytes": ("receive_buffer_bytes", int),
    "send.buffer.bytes": ("send_buffer_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "isolation.level": ("isolation_level", str),
    "check.crcs": ("check_crcs", _bool),
    "client.dns.lookup": ("client_dns_lookup", str),
}

# librdkafka name where it differs from the accepted (Java-style) key
_LIBRDKAFKA_NAME = {
    "request.timeout.ms": "socket.timeout.ms",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "sasl.mechanisms": "sasl.mechanism",
}
# librdkafka-only properties (fetch queue tuning, diagnostics) -> converter; kafka-python and
# Spark's Java connector have no equivalent and leave them out.
_LIBRDKAFKA_ONLY: dict[str, Any] = {
    "queued.max.messages.kbytes": int,
    "queued.min.messages": int,
    "fetch.queue.backoff.ms": int,
    "fetch.error.backoff.ms": int,
    "socket.keepalive.enable": _bool,
    "debug": str,
}
LIBRDKAFKA_ONLY = frozenset(_LIBRDKAFKA_ONLY)

# Properties that describe consumer-group or producer behaviour: the planner and the job set these
# themselves (group from the pipeline, no auto commit, explicit seeks), so they are ignored.
_IGNORED = frozenset(
    {
        "group.id",
        "auto.offset.reset",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "acks",
        "linger.ms",
        "batch.size",
        "compression.type",
        "enable.idempotence",
    }
)

SUPPORTED_PROPERTIES = frozenset(_TO_PYTHON) | LIBRDKAFKA_ONLY

_SECRET_WORDS = ("password", "secret", "token", "jaas")


def redact(props: dict[str, Any]) -> dict[str, Any]:
    """A copy safe to log: values of secret-looking keys replaced."""
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in props.items()}


def _checked(props: dict[str, Any], source: str) -> list[tuple[str, Any]]:
    """The (key, value) pairs of ``props`` that a client uses (ignored keys dropped, references to
    secrets resolved on this host: :mod:`.credentials`), after the whitelist check; raises
    :class:`KafkaConfigError` naming ``source`` and the keys."""
    unknown = sorted(k for k in props if k not in SUPPORTED_PROPERTIES and k not in _IGNORED)
    if unknown:
        raise KafkaConfigError(
            f"{source}: unsupported Kafka properties {unknown}. Supported: "
            f"{sorted(SUPPORTED_PROPERTIES)} (ignored: {sorted(_IGNORED)}). Remove them or rename them "
            "to their librdkafka names."
        )
    if not props.get("bootstrap.servers"):
        raise KafkaConfigError(
            f"{source}: 'bootstrap.servers' is missing; set it in the connection's extra JSON, "
            'e.g. {"bootstrap.servers": "broker1:9092,broker2:9092"}'
        )
    return [(k, v) for k, v in resolved(props, source=source).items() if k not in _IGNORED]


def _convert(key: str, value: Any, conv: Any, source: str) -> Any:
    try:
        return conv(value)
    except (TypeError, ValueError) as e:
        raise KafkaConfigError(f"{source}: property {key!r} has an invalid value {value!r}: {e}") from e


def to_kafka_python(props: dict[str, Any], *, source: str = "Kafka connection") -> dict[str, Any]:
    """kafka-python client arguments for ``props``.

    Raises :class:`KafkaConfigError` naming ``source`` and the key when a property is unknown or its
    value is invalid; ``bootstrap.servers`` is required. librdkafka-only properties are left out.
    """
    out: dict[str, Any] = {}
    for key, value in _checked(props, source):
        if key in _TO_PYTHON:
            arg, conv = _TO_PYTHON[key]
            out[arg] = _convert(key, value, conv, source)
        else:  # librdkafka-only: still validated, so the same connection works with both clients
            _convert(key, value, _LIBRDKAFKA_ONLY[key], source)
    return out


def _rdkafka_value(key: str, value: Any, source: str) -> Any:
    if key in _LIBRDKAFKA_ONLY:
        return _convert(key, value, _LIBRDKAFKA_ONLY[key], source)
    _, conv = _TO_PYTHON[key]
    checked = _convert(key, value, conv, source)  # same validation as for kafka-python
    if conv is int or conv is _bool:
        return checked
    # librdkafka takes strings as written (enums are case-insensitive there), e.g.
    # ssl.endpoint.identification.algorithm "none" | "https"
    return str(value)


def to_confluent(props: dict[str, Any], *, source: str = "Kafka connection") -> dict[str, Any]:
    """confluent-kafka (librdkafka) configuration for ``props``: the same whitelist and value checks
    as :func:`to_kafka_python`, keys under their librdkafka names. Consumer-group and producer
    properties are left out (callers set what they need)."""
    out: dict[str, Any] = {}
    for key, value in _checked(props, source):
        out[_LIBRDKAFKA_NAME.get(key, key)] = _rdkafka_value(key, value, source)
    return out


def to_spark_kafka_options(props: dict[str, Any], *, source: str = "Kafka connection") -> dict[str, str]:
    """Options for Spark's ``format("kafka")`` source: Java client properties prefixed ``kafka.``.

    * SASL: ``sasl.username``/``sasl.password`` become the Java client's JAAS configuration (PLAIN
      or SCRAM login module), each value quoted so that Kafka's parser reads it as written
      (:func:`.credentials.jaas_quoted`);
    * TLS: ``ssl.ca.location`` is a PEM truststore; a client certificate (mutual TLS) given as
      ``ssl.certificate.location`` and ``ssl.key.location`` (PEM files, the key PKCS#8, encrypted
      with ``ssl.key.password`` or not) is a PEM keystore: the one file when both name it, else
      the two files' contents read by Kafka's ``DirectoryConfigProvider`` on the Spark hosts;
    * references to secrets (``${dir:…}``, ``${env:…}``) are passed as they are, with the config
      providers that resolve them on the Spark hosts (:mod:`.credentials`).
    """
    out: dict[str, str] = {}
    providers: set[str] = set()

    def value_of(key: str, value: Any) -> str:
        ref = reference(value, name=key, source=source)
        if ref is not None:
            providers.add(ref.provider)
        return str(value)

    username = props.get("sasl.username")
    password = props.get("sasl.password")
    mechanism = str(props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN"))).upper()
    certificate = props.get("ssl.certificate.location")
    key_file = props.get("ssl.key.location")
    for key, value in props.items():
        if key in _IGNORED or key in LIBRDKAFKA_ONLY or key in _SPARK_MAPPED:
            continue
        if key == "ssl.ca.location":
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = str(value)
            continue
        out[f"kafka.{key}"] = value_of(key, value)
    if certificate is not None or key_file is not None:
        if certificate is None or key_file is None:
            given, missing = (
                ("ssl.certificate.location", "ssl.key.location")
                if certificate is not None
                else ("ssl.key.location", "ssl.certificate.location")
            )
            raise KafkaConfigError(
                f"{source}: {given!r} is set but {missing!r} is not: a client certificate (mutual TLS) needs "
                "both, the certificate's PEM file and its private key's (or the same file holding both)"
            )
        problem = java_key_problem(key_file) if props.get("ssl.key.password") else None
        if problem:
            raise KafkaConfigError(f"{source}: 'ssl.key.location': {problem}")
        out["kafka.ssl.keystore.type"] = "PEM"
        if str(certificate) == str(key_file):
            out["kafka.ssl.keystore.location"] = str(certificate)
        else:
            out["kafka.ssl.keystore.certificate.chain"] = _file_content_reference(
                "ssl.certificate.location", certificate, source
            )
            out["kafka.ssl.keystore.key"] = _file_content_reference("ssl.key.location", key_file, source)
            providers.add("dir")
    if username is not None:
        module = (
            "org.apache.kafka.common.security.scram.ScramLoginModule"
            if mechanism.startswith("SCRAM")
            else "org.apache.kafka.common.security.plain.PlainLoginModule"
        )
        ref = reference(password, name="sasl.password", source=source)
        if ref is not None:  # Kafka puts the referenced value into the JAAS string as it is
            providers.add(ref.provider)
            quoted_password = f'"{ref}"'
        else:
            quoted_password = jaas_quoted(str(password or ""))
        out["kafka.sasl.mechanism"] = mechanism
        out["kafka.sasl.jaas.config"] = (
            f"{module} required username={jaas_quoted(str(username))} password={quoted_password};"
        )
    if providers:
        out["kafka.config.providers"] = ",".join(sorted(providers))
        for name in sorted(providers):
            out[f"kafka.config.providers.{name}.class"] = PROVIDER_CLASSES[name]
    return out


#: Properties :func:`to_spark_kafka_options` turns into other Java client settings.
_SPARK_MAPPED = frozenset(
    {"sasl.username", "sasl.password", "sasl.mechanisms", "ssl.certificate.location", "ssl.key.location"}
)


def _file_content_reference(name: str, path: Any, source: str) -> str:
    """A ``DirectoryConfigProvider`` reference to the content of the file ``path``."""
    directory, _, file_name = str(path).rpartition("/")
    if not str(path).startswith("/") or not directory or not file_name or any(c in str(path) for c in ":{}"):
        raise KafkaConfigError(
            f"{source}: {name!r} = {path!r} must be an absolute path without ':', '{{' or '}}' for Spark's "
            "Kafka connector (its Java client reads the file's content through Kafka's DirectoryConfigProvider)"
        )
    return "${dir:" + directory + ":" + file_name + "}"
