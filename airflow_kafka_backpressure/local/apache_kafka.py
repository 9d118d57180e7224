"""Start and stop a single-node Apache Kafka (KRaft, combined broker + controller) on 127.0.0.1.

The jars come from Maven Central once (:func:`~airflow_kafka_backpressure.local.jars.kafka_broker_jars`);
the storage is formatted with ``kafka.tools.StorageTool format --standalone`` and the server runs as
``kafka.Kafka server.properties`` in a JVM of its own session, with its data, configuration and
log in ``work_dir``. Both listeners (clients and controller) bind to 127.0.0.1 on free ports. Kafka
4.x needs Java 17 or newer (``$JAVA_HOME/bin/java``, else ``java`` on PATH).

``advertised_port`` lets a relay stand in front of the broker (the tests' fetch gate): clients are
told to connect there.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from ..kafka.clients import new_client
from .broker import BrokerError, await_start, free_port, metadata_ok, port_open, stop_session
from .jars import jar_paths, kafka_broker_jars

#: Settings a one-node broker needs (replication factors of the internal topics must be 1) and
#: ones that make a test or demo broker quick (no rebalance delay, few internal partitions).
SINGLE_NODE_DEFAULTS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    # retention and deleted records are checked every 5 s instead of 5 min
    "log.retention.check.interval.ms": "5000",
}

#: Kafka's logging (log4j2): everything at INFO to stdout, which goes to the work dir's kafka.log
LOG4J2_CONFIG = Path(__file__).with_name("kafka-log4j2.yaml")


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("Apache Kafka needs Java 17 or newer: set JAVA_HOME or put java on PATH")
    return found


def new_cluster_id() -> str:
    """A KRaft cluster id: a UUID in URL-safe base64 without padding, as ``kafka-storage random-uuid``.

    One in 64 such strings starts with ``-``, which a command line reads as an option
    (``kafka-storage format -t -abc`` fails with "expected one argument"); like Kafka's own
    ``Uuid.randomUuid()``, draw again until it does not.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """An Apache Kafka server on ``127.0.0.1:port`` (KRaft, one node); a context manager.

    >>> with KafkaBroker(work_dir="/tmp/kbp-kafka") as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        advertised_port: int | None = None,
        host: str = "127.0.0.1",
        config: Mapping[str, str] | None = None,
        heap: str = "512m",
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.advertised_port = advertised_port or self.port
        self.controller_port = free_port(host)
        self.work_dir = Path(work_dir).resolve()
        self.config = dict(config or {})
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "kafka.log"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    def properties(self) -> dict[str, str]:
        controller = f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": controller,
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.advertised_port},CONTROLLER://{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **SINGLE_NODE_DEFAULTS,
        }
        props.update(self.config)
        return props

    def _java(self, main: str, *args: str, classpath: str) -> list[str]:
        return [
            java_binary(),
            f"-Xmx{self.heap}",
            f"-Djava.io.tmpdir={self.work_dir / 'tmp'}",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            classpath,
            main,
            *args,
        ]

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        if self.process is not None:
            raise BrokerError(f"Kafka broker on {self.bootstrap} already started (pid {self.pid})")
        classpath = os.pathsep.join(jar_paths(kafka_broker_jars()))
        (self.work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        server_properties = self.work_dir / "server.properties"
        server_properties.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if not (self.data_dir / "meta.properties").exists():
            fmt = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    f"--cluster-id={new_cluster_id()}",
                    "-c",
                    str(server_properties),
                    classpath=classpath,
                ),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if fmt.returncode != 0:
                raise BrokerError(
                    f"kafka.tools.StorageTool format failed (exit {fmt.returncode}) for {self.data_dir}:\n"
                    f"{(fmt.stdout + fmt.stderr)[-3000:]}"
                )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(server_properties), classpath=classpath),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.work_dir,
                start_new_session=True,
            )
        await_start(
            self,
            lambda: (
                port_open(self.host, self.port)
                and metadata_ok(f"{self.host}:{self.port}", timeout_s=2.0)
                and self._group_coordinator_ready()
            ),
            timeout_s,
            BrokerError,
            f"Kafka exited with code {{code}} while starting on {self.bootstrap}; see {self.log_path}",
            f"Kafka on {self.bootstrap} did not answer metadata within {timeout_s:g}s; see {self.log_path}",
        )
        return self

    def _group_coordinator_ready(self) -> bool:
        """True once a consumer group's offsets can be read: the first such request makes the broker
        create and load ``__consumer_offsets``, answering "coordinator not available" or "not
        coordinator" meanwhile. Waiting for it here gives every user of the broker a settled group
        coordinator (a test's first commit then meets no coordinator moving under it)."""
        from kafka import KafkaAdminClient

        try:
            admin = new_client(
                KafkaAdminClient,
                bootstrap_servers=f"{self.host}:{self.port}",
                request_timeout_ms=5000,
                client_id="kbp-ready",
            )
        except Exception:
            return False
        try:
            admin.list_group_offsets("kbp-broker-ready")
            return True
        except Exception:
            return False
        finally:
            admin.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL; the JVM is the leader of its own session."""
        proc, self.process = self.process, None
        if proc is not None:
            stop_session(proc, timeout_s)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
