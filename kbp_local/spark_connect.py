"""Start and stop a local Spark Connect server from the installed pyspark (the connect engine's
embedded default).

pip's pyspark has no ``start-connect-server.sh``: the server is started as
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal`` with
its gRPC endpoint, driver and UI bound to 127.0.0.1. Its scratch directories live under
``work_dir``. It runs in its own session (process group) and is stopped with it, by PID.

``token``: the server then requires every client to present it (Spark Connect's pre-shared token,
``spark.connect.authenticate.token``, handed over in the server's environment as
``SPARK_CONNECT_AUTHENTICATE_TOKEN``: never on its command line or in its UI). pyspark's client sends
a token only over TLS, or to ``localhost`` (:attr:`SparkConnectServer.client_url`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from airflow_kafka_backpressure.engines.environment import spark_conf_defaults, spark_submit_env
from kbp_local.process import LocalServer, free_port, port_open

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The server's environment variable for its pre-shared token (Spark's own name).
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: An operation whose client went away (a killed task) is interrupted after this long.
DETACHED_TIMEOUT = "60s"


class SparkConnectError(RuntimeError):
    pass


class SparkConnectServer(LocalServer):
    """A Spark Connect server on ``127.0.0.1:port`` running ``master``; a context manager.

    >>> with SparkConnectServer(work_dir="/tmp/kbp-connect") as server:
    ...     server.url  # 'sc://127.0.0.1:PORT'
    """

    what = "the Spark Connect server"
    error = SparkConnectError
    start_timeout_s = 120.0
    stop_timeout_s = 30.0

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        master: str = "local[2]",
        conf: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.master = master
        self.work_dir = Path(work_dir).resolve()
        self.conf = dict(conf or {})
        self.token = token
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        """The URL a client connects with: with the token, ``localhost`` (pyspark refuses to send a
        token to another host without TLS)."""
        if self.token is None:
            return self.url
        return f"sc://localhost:{self.port}/;token={self.token}"

    @property
    def address(self) -> str:
        return self.url

    @property
    def log_path(self) -> Path:
        return self.work_dir / "spark-connect.log"

    @property
    def cwd(self) -> Path:
        return self.work_dir

    @property
    def _local_only(self) -> bool:
        return self.host in ("127.0.0.1", "localhost")

    def command(self) -> list[str]:
        conf = spark_conf_defaults(
            self.work_dir,
            {
                "spark.connect.grpc.binding.address": self.host,
                "spark.connect.grpc.binding.port": str(self.port),
                "spark.connect.execute.manager.detachedTimeout": DETACHED_TIMEOUT,
                **self.conf,
            },
            local_only=self._local_only,
        )
        spark_submit = shutil.which("spark-submit", path=self._env.get("PATH"))
        if spark_submit is None:
            raise SparkConnectError(
                "spark-submit is not on PATH: install pyspark in this interpreter's environment"
            )
        cmd = [
            spark_submit,
            "--master",
            self.master,
            "--class",
            SERVER_CLASS,
            "--name",
            "kbp-spark-connect",
        ]
        for key, value in sorted(conf.items()):
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "spark-internal"]

    def prepare(self) -> None:
        """Its folder, and its environment (the command finds spark-submit on its PATH)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(spark_submit_env(self.work_dir, local_only=self._local_only))
        env.pop(TOKEN_ENV, None)
        if self.token is not None:
            env[TOKEN_ENV] = self.token
        self._env = env

    def env(self) -> dict[str, str]:
        return self._env

    def ready(self) -> bool:
        return port_open(self.host, self.port)
