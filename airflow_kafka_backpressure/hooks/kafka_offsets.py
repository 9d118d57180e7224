"""KafkaOffsetsHook: an Airflow connection in the Kafka provider's format → offset queries.

The connection is the one apache-airflow-providers-apache-kafka uses (``kafka_default``): its extra
JSON holds librdkafka-style properties such as ``bootstrap.servers``, ``security.protocol``,
``sasl.mechanism``, ``sasl.username`` and ``sasl.password``. Host and port are used when the extra
has no ``bootstrap.servers``.

The connection type ``kafka`` belongs to the official provider: this provider declares it (with the
same form) only when the official one is not installed — see :mod:`..get_provider_info`.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from ..get_provider_info import ui_field_behaviour
from ..kafka.offsets import KafkaOffsets


class KafkaOffsetsHook(BaseHook):
    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka"

    def __init__(self, kafka_config_id: str = default_conn_name, timeout_s: float = 10.0) -> None:
        super().__init__()
        self.kafka_config_id = kafka_config_id
        self.timeout_s = timeout_s

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The official provider's form: a JSON "Config Dict" of librdkafka properties."""

        return ui_field_behaviour(cls.conn_type)

    def client_properties(self) -> dict[str, Any]:
        """The connection's librdkafka-style properties, with ``bootstrap.servers`` always set."""
        conn = self.get_connection(self.kafka_config_id)
        props = dict(conn.extra_dejson or {})
        if not props.get("bootstrap.servers") and conn.host:
            props["bootstrap.servers"] = f"{conn.host}:{conn.port}" if conn.port else conn.host
        return props

    def get_conn(self) -> KafkaOffsets:
        """A :class:`KafkaOffsets` client; close it (or use it as a context manager) when done."""
        return KafkaOffsets(
            self.client_properties(),
            source=f"Kafka connection {self.kafka_config_id!r}",
            timeout_s=self.timeout_s,
        )

    def test_connection(self) -> tuple[bool, str]:
        """List the cluster's topics (bounded by ``timeout_s``); the message names the connection."""
        try:
            with self.get_conn() as client:
                topics = client.topics()
                bootstrap = client.bootstrap
            return True, (
                f"Kafka connection {self.kafka_config_id!r}: connected to {bootstrap}, {len(topics)} topic(s) visible"
            )
        except Exception as e:
            return False, str(e)
