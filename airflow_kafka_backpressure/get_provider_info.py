"""Provider metadata, read by Airflow's providers manager (entry point ``apache_airflow_provider``).

Keep this module free of heavy imports (the standard library only): Airflow loads it while starting up.

**Connection types.** ``kbp_ledger`` (:class:`~airflow_kafka_backpressure.hooks.ledger.LedgerHook`)
and ``schema_registry`` (:class:`~airflow_kafka_backpressure.hooks.schema_registry.SchemaRegistryHook`)
are this provider's own. The Kafka connection uses the format of the official
``apache-airflow-providers-apache-kafka`` (conn type ``kafka``), which our
:class:`~airflow_kafka_backpressure.hooks.kafka_offsets.KafkaOffsetsHook` reads as it is. Airflow
registers a connection type for the first provider that declares it, in the order of the
providers' package names, and only warns about the others, so declaring ``kafka`` next to the
official provider would take the type (its form, test button and ``Connection.get_hook()``) away
from it: ``airflow-provider-…`` sorts before ``apache-airflow-providers-…``. We therefore declare
``kafka`` only when the official provider is not installed, with the same form as the official one
(a JSON "Config Dict" of librdkafka properties), so the UI can create a ``kafka_default`` either way.

The forms are declared here (``ui-field-behaviour``, ``conn-fields``), the non-deprecated way in
Airflow 3.2+; the hooks' ``get_ui_field_behaviour()`` return the same data (:func:`ui_field_behaviour`).
"""

from __future__ import annotations

from typing import Any

#: The distribution whose connection type ``kafka`` we leave alone when it is installed.
OFFICIAL_KAFKA_PROVIDER = "apache-airflow-providers-apache-kafka"

LEDGER_CONNECTION: dict[str, Any] = {
    "connection-type": "kbp_ledger",
    "hook-class-name": "airflow_kafka_backpressure.hooks.ledger.LedgerHook",
    "hook-name": "Kafka Backpressure ledger (SQL database)",
    "ui-field-behaviour": {
        "hidden-fields": ["extra"],
        "relabeling": {"host": "Database host", "schema": "Database name", "login": "User"},
        "placeholders": {
            "host": "postgres.example.com (empty: use the SQLAlchemy URL)",
            "port": "5432",
            "schema": "kbp_ledger",
            "login": "kbp",
        },
    },
    "conn-fields": {
        "sqlalchemy_url": {
            "label": "SQLAlchemy URL",
            "description": (
                "Used instead of host/port/database when set, e.g. postgresql+psycopg2://kbp@db:5432/kbp_ledger "
                "or sqlite:////var/lib/kbp/ledger.db. Leave the password out of it: the Password field fills it in."
            ),
            "schema": {"type": ["string", "null"]},
        },
        "driver": {
            "label": "Driver",
            "description": "SQLAlchemy dialect+driver used with host/port/database (psycopg2 is in the 'postgres' extra).",
            "schema": {
                "type": "string",
                "enum": ["postgresql+psycopg2", "postgresql"],
                "default": "postgresql+psycopg2",
            },
        },
    },
}

KAFKA_CONNECTION: dict[str, Any] = {
    "connection-type": "kafka",
    "hook-class-name": "airflow_kafka_backpressure.hooks.kafka_offsets.KafkaOffsetsHook",
    "hook-name": "Apache Kafka",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "login", "password", "port", "host"],
        "relabeling": {"extra": "Config Dict"},
        "placeholders": {
            "extra": (
                '{"bootstrap.servers": "broker1:9092,broker2:9092", "security.protocol": "SASL_SSL", '
                '"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "...", "sasl.password": "..."}'
            ),
        },
    },
}


#: The record decoders' Schema Registry (Confluent's REST API, as Confluent Platform and Cloud and the
#: registries compatible with it serve it); its credentials reach the registry client only.
SCHEMA_REGISTRY_CONNECTION: dict[str, Any] = {
    "connection-type": "schema_registry",
    "hook-class-name": "airflow_kafka_backpressure.hooks.schema_registry.SchemaRegistryHook",
    "hook-name": "Schema Registry (Confluent API)",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "extra"],
        "relabeling": {
            "host": "Registry URL",
            "login": "User (basic auth)",
            "password": "Password (basic auth)",
        },
        "placeholders": {
            "host": "https://registry.example.com:8081",
            "port": "used when the URL has no scheme",
            "login": "user or API key",
        },
    },
    "conn-fields": {
        "ca_location": {
            "label": "TLS CA certificate",
            "description": "Path on the workers of the PEM file (or directory) of the CA that signed the registry's certificate; empty: the system's CAs.",
            "schema": {"type": ["string", "null"]},
        },
        "certificate_location": {
            "label": "TLS client certificate",
            "description": "Path of a PEM client certificate, for a registry that asks for one.",
            "schema": {"type": ["string", "null"]},
        },
        "key_location": {
            "label": "TLS client key",
            "description": "Path of the client certificate's PEM private key (if not in the certificate's file).",
            "schema": {"type": ["string", "null"]},
        },
        "timeout_s": {
            "label": "Timeout (s)",
            "description": "Seconds per request to the registry.",
            "schema": {"type": ["number", "null"], "default": 30.0},
        },
    },
}


def official_kafka_provider_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(OFFICIAL_KAFKA_PROVIDER)
    except PackageNotFoundError:
        return False
    return True


def connection_types(official_kafka: bool) -> list[dict[str, Any]]:
    """The connection types this provider declares (``kafka`` only without the official provider)."""
    ours = [LEDGER_CONNECTION, SCHEMA_REGISTRY_CONNECTION]
    return ours if official_kafka else [*ours, KAFKA_CONNECTION]


def ui_field_behaviour(conn_type: str) -> dict[str, Any]:
    """A declared form in the shape of ``BaseHook.get_ui_field_behaviour()``."""
    declared = {
        c["connection-type"]: c for c in (LEDGER_CONNECTION, KAFKA_CONNECTION, SCHEMA_REGISTRY_CONNECTION)
    }[conn_type]["ui-field-behaviour"]
    return {
        "hidden_fields": list(declared["hidden-fields"]),
        "relabeling": dict(declared["relabeling"]),
        "placeholders": dict(declared["placeholders"]),
    }


def get_provider_info() -> dict:
    return provider_info(official_kafka_provider_installed())


def provider_info(official_kafka: bool) -> dict:
    return {
        "package-name": "airflow-provider-kafka-backpressure",
        "name": "Kafka Backpressure",
        "description": (
            "Micro-batch Kafka ingestion on Spark, orchestrated by Airflow, with Spark Streaming's "
            "PID backpressure and streaming dynamic allocation moved into the orchestrator."
        ),
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Kafka Backpressure",
                "external-doc-url": "https://github.com/airflow-provider-kafka-backpressure",
                "tags": ["apache", "kafka", "spark"],
            }
        ],
        "operators": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.operators.plan",
                    "airflow_kafka_backpressure.operators.ingest",
                    "airflow_kafka_backpressure.operators.record",
                    "airflow_kafka_backpressure.operators.scale",
                    "airflow_kafka_backpressure.operators.replay",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.sensors.failed_ranges",
                    "airflow_kafka_backpressure.sensors.kafka_lag",
                ],
            }
        ],
        "hooks": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.hooks.kafka_offsets",
                    "airflow_kafka_backpressure.hooks.ledger",
                    "airflow_kafka_backpressure.hooks.schema_registry",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "Kafka Backpressure",
                "python-modules": [
                    "airflow_kafka_backpressure.triggers.failed_ranges",
                    "airflow_kafka_backpressure.triggers.kafka_lag",
                ],
            }
        ],
        "connection-types": connection_types(official_kafka),
    }
