"""Start and stop a single-node Apache Kafka (KRaft, combined broker + controller) on 127.0.0.1.

The jars come from Maven Central once (:func:`~kbp_local.jars.kafka_broker_jars`);
the storage is formatted with ``kafka.tools.StorageTool format --standalone`` and the server runs as
``kafka.Kafka server.properties`` in a JVM of its own session, with its data, configuration and
log in ``work_dir``. Both listeners (clients and controller) bind to 127.0.0.1 on free ports. Kafka
4.x needs Java 17 or newer (``$JAVA_HOME/bin/java``, else ``java`` on PATH).

``advertised_port`` lets a relay stand in front of the broker (the tests' fetch gate): clients are
told to connect there.

``secured=True`` adds a third listener, ``SECURED``: SASL/SCRAM (SHA-256 and SHA-512) over TLS, on
its own free port, with a throw-away CA and server certificate made at start (:mod:`.tls`). Its
users are created by :meth:`KafkaBroker.add_scram_user` through Kafka's Admin API (no password on a
command line); :meth:`KafkaBroker.secured_client_properties` gives the librdkafka-style properties a
client (or an Airflow ``kafka`` connection's extra) reads it with. It also adds ``MTLS``: TLS that
requires a client certificate signed by the same CA (:meth:`KafkaBroker.mtls_client_properties`
issues one). The PLAINTEXT listener stays, for the broker's own readiness checks and for test
producers.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from airflow_kafka_backpressure.kafka.clients import new_client
from kbp_local.broker import BrokerError, metadata_ok
from kbp_local.jars import jar_paths, kafka_broker_jars
from kbp_local.process import LocalServer, port_open, ports_beside
from kbp_local.tls import make_client_tls, make_server_tls

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
    # the controller appends a no-op record to its metadata log when idle, for other nodes to see
    # it alive: every 500 ms by default (a third of an idle node's CPU, measured here), every 5 s
    # on a node that is alone
    "metadata.max.idle.interval.ms": "5000",
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


class KafkaBroker(LocalServer):
    """An Apache Kafka server on ``127.0.0.1:port`` (KRaft, one node); a context manager.

    >>> with KafkaBroker(work_dir="/tmp/kbp-kafka") as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    what = "Kafka"
    error = BrokerError
    start_timeout_s = 90.0
    stop_timeout_s = 30.0  # SIGTERM: a controlled shutdown

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        advertised_port: int | None = None,
        host: str = "127.0.0.1",
        config: Mapping[str, str] | None = None,
        heap: str = "512m",
        secured: bool = False,
    ) -> None:
        self.host = host
        # the listeners' ports chosen together: each distinct (kbp_local.process.ports_beside)
        self.port, chosen = ports_beside(port, 3 if secured else 1, host, besides=[advertised_port])
        self.advertised_port = advertised_port or self.port
        self.controller_port = chosen.pop()
        self.secured = secured
        self.secured_port = chosen.pop() if secured else None
        self.mtls_port = chosen.pop() if secured else None
        self.work_dir = Path(work_dir).resolve()
        self.config = dict(config or {})
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    @property
    def log_path(self) -> Path:
        return self.work_dir / "kafka.log"

    @property
    def cwd(self) -> Path:
        return self.work_dir

    @property
    def server_properties(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def secured_bootstrap(self) -> str:
        """``host:port`` of the SASL_SSL listener (``secured=True`` only)."""
        if self.secured_port is None:
            raise BrokerError(
                f"the Kafka broker on {self.bootstrap} has no secured listener: start it with secured=True"
            )
        return f"{self.host}:{self.secured_port}"

    @property
    def mtls_bootstrap(self) -> str:
        """``host:port`` of the mutual-TLS listener (``secured=True`` only)."""
        if self.mtls_port is None:
            raise BrokerError(
                f"the Kafka broker on {self.bootstrap} has no mutual-TLS listener: start it with secured=True"
            )
        return f"{self.host}:{self.mtls_port}"

    @property
    def ca_path(self) -> Path:
        """The PEM certificate of the CA that signed the secured listener's certificate."""
        return self.work_dir / "tls" / "ca.pem"

    def _secured_properties(self) -> dict[str, str]:
        if self.secured_port is None:
            return {}
        listener, mtls = "listener.name.secured", "listener.name.mtls"
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        keystore = str(self.work_dir / "tls" / "server.pem")
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            f"{listener}.scram-sha-256.sasl.jaas.config": scram,
            f"{listener}.scram-sha-512.sasl.jaas.config": scram,
            f"{listener}.ssl.keystore.type": "PEM",
            f"{listener}.ssl.keystore.location": keystore,
            f"{mtls}.ssl.keystore.type": "PEM",
            f"{mtls}.ssl.keystore.location": keystore,
            f"{mtls}.ssl.truststore.type": "PEM",
            f"{mtls}.ssl.truststore.location": str(self.ca_path),
            f"{mtls}.ssl.client.auth": "required",
        }

    def properties(self) -> dict[str, str]:
        controller = f"{self.host}:{self.controller_port}"
        secured = (
            f",SECURED://{self.host}:{self.secured_port},MTLS://{self.host}:{self.mtls_port}"
            if self.secured_port
            else ""
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": controller,
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{controller}{secured}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.advertised_port},CONTROLLER://{controller}{secured}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
            + (",SECURED:SASL_SSL,MTLS:SSL" if secured else ""),
            "log.dirs": str(self.data_dir),
            **SINGLE_NODE_DEFAULTS,
            **self._secured_properties(),
        }
        props.update(self.config)
        return props

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = self._classpath
        return [
            java_binary(),
            f"-Xmx{self.heap}",
            f"-Djava.io.tmpdir={self.work_dir / 'tmp'}",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            classpath,
            # extra JVM options, last before the main class as in Kafka's kafka-run-class.sh, so
            # that they win over the ones above (the test suite's: a short-lived node's compiler
            # and collector)
            *shlex.split(os.environ.get("KAFKA_OPTS", "")),
            main,
            *args,
        ]

    def prepare(self) -> None:
        """The server's properties, its TLS files (secured), and its storage formatted once."""
        self._classpath = os.pathsep.join(jar_paths(kafka_broker_jars()))
        (self.work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        if self.secured and not self.ca_path.exists():
            make_server_tls(self.work_dir / "tls", hosts=(self.host,))
        self.server_properties.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if not (self.data_dir / "meta.properties").exists():
            fmt = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    f"--cluster-id={new_cluster_id()}",
                    "-c",
                    str(self.server_properties),
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

    def command(self) -> list[str]:
        return self._java("kafka.Kafka", str(self.server_properties))

    def ready(self) -> bool:
        return (
            port_open(self.host, self.port)
            and metadata_ok(f"{self.host}:{self.port}", timeout_s=2.0)
            and self._group_coordinator_ready()
        )

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

    def add_scram_user(self, username: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
        """Create (or change) a SCRAM user of the secured listener, through the Admin API on the
        PLAINTEXT listener, and wait until the secured listener accepts it."""
        upsert_scram_user(
            {"bootstrap.servers": f"{self.host}:{self.port}"},
            self.secured_client_properties(username, password, mechanism),
            hint=f"see {self.log_path}",
        )

    def secured_client_properties(
        self, username: str, password: str, mechanism: str = "SCRAM-SHA-512"
    ) -> dict[str, str]:
        """librdkafka-style properties of a client of the secured listener: what an Airflow
        ``kafka`` connection's extra holds for it."""
        return {
            "bootstrap.servers": self.secured_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": username,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca_path),
        }

    def mtls_client_properties(
        self, directory: Path, name: str, key_password: str | None = None, key_encryption: str = "pbes2"
    ) -> dict[str, str]:
        """A new client certificate for ``name`` (in ``directory``; its PKCS#8 key encrypted with
        ``key_password`` if given, by ``key_encryption``: :func:`.tls.make_client_tls`) and the
        librdkafka-style properties of a client of the mutual-TLS listener that presents it."""
        client = make_client_tls(
            self.work_dir / "tls", directory, name, key_password=key_password, key_encryption=key_encryption
        )
        props = {
            "bootstrap.servers": self.mtls_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_path),
            "ssl.certificate.location": str(client.certificate_path),
            "ssl.key.location": str(client.key_path),
        }
        if key_password:
            props["ssl.key.password"] = key_password
        return props


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def upsert_scram_user(
    admin_properties: Mapping[str, str],
    user_properties: Mapping[str, str],
    timeout_s: float = 30.0,
    hint: str = "",
) -> None:
    """Create (or change) the SCRAM user of ``user_properties`` (librdkafka-style: ``sasl.username``,
    ``sasl.password``, ``sasl.mechanism`` and its listener's ``bootstrap.servers``, ``ssl.*``)
    through the Admin API of a client with ``admin_properties``, then wait until that user logs in:
    a credential reaches the listeners through the metadata log, a moment later. kafka-python (the
    package's own client) does both, so the compose stack's image needs nothing more."""
    from kafka import KafkaAdminClient
    from kafka.admin import UserScramCredentialUpsertion

    from airflow_kafka_backpressure.kafka.config import to_kafka_python

    username, mechanism = user_properties["sasl.username"], user_properties["sasl.mechanism"]
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"SCRAM mechanism {mechanism!r}: choose one of {', '.join(SCRAM_MECHANISMS)}")
    admin = new_client(
        KafkaAdminClient,
        client_id="kbp-scram-admin",
        **to_kafka_python(dict(admin_properties), source="admin client"),
    )
    try:
        errors = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(username, mechanism, user_properties["sasl.password"])]
        )
    finally:
        admin.close()
    if any(errors.values()):
        raise BrokerError(
            f"SCRAM user {username!r} was not created: {errors}" + (f"; {hint}" if hint else "")
        )
    login = to_kafka_python(dict(user_properties), source=f"SCRAM user {username!r}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            new_client(KafkaAdminClient, client_id="kbp-scram-login", **login).close()
            return
        except Exception as e:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"SCRAM user {username!r} could not log in to {user_properties['bootstrap.servers']} "
                    f"within {timeout_s:.0f}s: {e}" + (f"; {hint}" if hint else "")
                ) from e
            time.sleep(0.5)
