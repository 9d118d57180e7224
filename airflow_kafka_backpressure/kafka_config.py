"""Kafka client properties → kafka-python arguments, and → Spark's native ``kafka.*`` options.

Connections use the format of apache-airflow-providers-apache-kafka: the connection's extra JSON
holds librdkafka-style properties (``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``ssl.ca.location`` …). The bounded Spark job receives the
same properties and converts them itself, so one set of settings serves the planner, the Python
reader and Spark's own Kafka connector.

Pure Python: no Airflow, Spark or Kafka imports.
"""

from __future__ import annotations

from typing import Any


class KafkaConfigError(ValueError):
    pass


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

_SECRET_WORDS = ("password", "secret", "token", "jaas")


def redact(props: dict[str, Any]) -> dict[str, Any]:
    """A copy safe to log: values of secret-looking keys replaced."""
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in props.items()}


def to_kafka_python(props: dict[str, Any], *, source: str = "Kafka connection") -> dict[str, Any]:
    """kafka-python client arguments for ``props``.

    Raises :class:`KafkaConfigError` naming ``source`` and the key when a property is unknown or its
    value is invalid; ``bootstrap.servers`` is required.
    """
    out: dict[str, Any] = {}
    unknown = []
    for key, value in props.items():
        if key in _IGNORED:
            continue
        if key not in _TO_PYTHON:
            unknown.append(key)
            continue
        arg, conv = _TO_PYTHON[key]
        try:
            out[arg] = conv(value)
        except (TypeError, ValueError) as e:
            raise KafkaConfigError(f"{source}: property {key!r} has an invalid value {value!r}: {e}") from e
    if unknown:
        raise KafkaConfigError(
            f"{source}: unsupported Kafka properties {sorted(unknown)}. Supported: "
            f"{sorted(_TO_PYTHON)} (ignored: {sorted(_IGNORED)}). Remove them or rename them to "
            "their librdkafka names."
        )
    if not out.get("bootstrap_servers"):
        raise KafkaConfigError(
            f"{source}: 'bootstrap.servers' is missing; set it in the connection's extra JSON, "
            'e.g. {"bootstrap.servers": "broker1:9092,broker2:9092"}'
        )
    return out


def to_spark_kafka_options(props: dict[str, Any]) -> dict[str, str]:
    """Options for Spark's ``format("kafka")`` source: Java client properties prefixed ``kafka.``."""
    out: dict[str, str] = {}
    username = props.get("sasl.username")
    password = props.get("sasl.password")
    mechanism = str(props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN"))).upper()
    for key, value in props.items():
        if key in _IGNORED or key in ("sasl.username", "sasl.password", "sasl.mechanisms"):
            continue
        if key == "ssl.ca.location":
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = str(value)
            continue
        if key == "ssl.certificate.location":
            out["kafka.ssl.keystore.type"] = "PEM"
            out["kafka.ssl.keystore.certificate.chain"] = str(value)
            continue
        out[f"kafka.{key}"] = str(value)
    if username is not None:
        module = (
            "org.apache.kafka.common.security.scram.ScramLoginModule"
            if mechanism.startswith("SCRAM")
            else "org.apache.kafka.common.security.plain.PlainLoginModule"
        )
        out["kafka.sasl.mechanism"] = mechanism
        out["kafka.sasl.jaas.config"] = (
            f'{module} required username="{username}" password="{password or ""}";'
        )
    return out
