"""Spark fixtures (session-scoped local[2] SparkSession, spark-submit environment).

* ``spark_work_dir`` — scratch directory for Spark (local dirs, java.io.tmpdir) under ``.tmp/``.
* ``spark`` — one local[2] SparkSession for the whole test session, configured like production
  (:mod:`airflow_kafka_backpressure.engines.environment`). Stopped at the end of the session.
* ``spark_submit`` — runs the real ``spark-submit`` command line the way the operator will:
  ``spark_submit(application, *app_args, py_files=[...], conf={...})`` → ``CompletedProcess``.
* ``spark_standalone`` — a real standalone master and one worker on 127.0.0.1 for the session
  (:class:`StandaloneCluster`: master URL, web UI URLs, ``/json`` readers). Stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_TMP_ROOT = Path(__file__).resolve().parents[1] / ".tmp"
SPARK_MASTER = "local[2]"
# A safety net against a hung child, not an assertion on speed.
SPARK_SUBMIT_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def spark_work_dir() -> Iterator[Path]:
    d = _TMP_ROOT / f"spark-{os.getpid()}"
    d.mkdir(parents=True, exist_ok=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(spark_work_dir: Path, spark_kafka_connector: str) -> Iterator[object]:
    with local_session(spark_work_dir, "kbp-tests", {"spark.sql.shuffle.partitions": "2"}) as session:
        yield session


@contextmanager
def local_session(work_dir: Path, app_name: str, conf: dict[str, str]) -> Iterator[object]:
    """A local[2] SparkSession configured like production plus ``conf``, in a JVM of its own: the
    JVM ends (and the environment is restored) on exit, so the next session starts a fresh one."""
    from airflow_kafka_backpressure.engines.environment import spark_conf_defaults, spark_submit_env

    # The py4j gateway starts the JVM through spark-submit with this process's environment. Only
    # the keys set here are put back on exit: a session fixture set up meanwhile (the Kafka
    # connector's SPARK_CONF_DIR) keeps what it set.
    ours = spark_submit_env(work_dir)
    saved = {key: os.environ.get(key) for key in ours}
    os.environ.update(ours)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(SPARK_MASTER).appName(app_name)
    for key, value in spark_conf_defaults(work_dir, conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        _shutdown_gateway()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _shutdown_gateway() -> None:
    """Close py4j and end the JVM this fixture started, now rather than at interpreter exit
    (py4j's finalizers log to streams pytest has closed by then)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="session")
def spark_submit(
    spark_work_dir: Path, spark_kafka_connector: str
) -> Callable[..., subprocess.CompletedProcess[str]]:
    from airflow_kafka_backpressure.engines.environment import spark_conf_defaults, spark_submit_env

    def run(
        application: str,
        *app_args: str,
        py_files: list[str] | None = None,
        conf: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["spark-submit", "--master", SPARK_MASTER, "--deploy-mode", "client"]
        for key, value in spark_conf_defaults(spark_work_dir, conf).items():
            cmd += ["--conf", f"{key}={value}"]
        if py_files:
            cmd += ["--py-files", ",".join(py_files)]
        cmd += [application, *app_args]
        full_env = dict(os.environ)
        full_env.update(spark_submit_env(spark_work_dir, env))
        return subprocess.run(
            cmd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=SPARK_SUBMIT_TIMEOUT_S,
            cwd=spark_work_dir,
        )

    return run


# --------------------------------------------------------------------------- standalone cluster

STANDALONE_WORKER_CORES = 8  # more than the machine has: a worker may declare any number
STANDALONE_WORKER_MEMORY = "6g"
STANDALONE_START_TIMEOUT_S = 120


class StandaloneCluster:
    """A running Spark standalone master and one worker, both on 127.0.0.1.

    ``master_url`` (``spark://127.0.0.1:PORT``), ``web_ui_url`` (the master's) and
    ``worker_web_ui_url``; ``master_json()`` / ``worker_json()`` read their ``/json`` status pages.
    """

    def __init__(self, master_url: str, web_ui_url: str, worker_web_ui_url: str, root: Path) -> None:
        self.master_url = master_url
        self.web_ui_url = web_ui_url
        self.worker_web_ui_url = worker_web_ui_url
        self.root = root

    @staticmethod
    def _get_json(url: str) -> dict:
        import json
        import urllib.request

        with urllib.request.urlopen(url.rstrip("/") + "/json/", timeout=10) as resp:
            return json.loads(resp.read())

    def master_json(self) -> dict:
        return self._get_json(self.web_ui_url)

    def worker_json(self) -> dict:
        return self._get_json(self.worker_web_ui_url)

    def completed_app(self, name: str, timeout_s: float = 60) -> dict:
        """The master's ``completedapps`` entry of the latest application called ``name``."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            apps = [a for a in self.master_json().get("completedapps", []) if a.get("name") == name]
            if apps:
                return max(apps, key=lambda a: a["starttime"])
            if time.monotonic() > deadline:
                raise AssertionError(f"the master lists no completed application named {name!r}")
            time.sleep(0.5)

    def finished_executors(
        self, app_id: str, expected: int | None = None, timeout_s: float = 60
    ) -> list[dict]:
        """The worker's finished executors of ``app_id`` (waits until ``expected`` are listed:
        the worker moves an executor to the finished list only once its process has exited)."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            worker = self.worker_json()
            done = [e for e in worker.get("finishedexecutors", []) if e.get("appid") == app_id]
            running = [e for e in worker.get("executors", []) if e.get("appid") == app_id]
            if (expected is None or len(done) >= expected) and not running:
                return done
            if time.monotonic() > deadline:
                return done
            time.sleep(0.5)


def _wait_for_log(proc: subprocess.Popen, log: Path, pattern: str, timeout_s: float) -> str:
    import re
    import time

    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        m = rx.search(text)
        if m:
            return m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = (log.read_text(errors="replace") if log.exists() else "")[-4000:]
    raise RuntimeError(f"{log.name}: no line matching {pattern!r} (exit code {proc.poll()}):\n{tail}")


@pytest.fixture(scope="module")
def spark_standalone() -> Iterator[StandaloneCluster]:
    """A Spark standalone master and one worker (``--cores 8 --memory 6g``) on 127.0.0.1, for the
    module that uses it (one module: two idle JVMs were left running through the rest of its shard).

    Started with the pip package's ``spark-class`` (no start scripts there); environment as the
    operator gives spark-submit (:func:`spark_submit_env`) plus ``java.io.tmpdir`` in the work tree
    for both daemons. Ready once the master's ``/json`` lists the worker ALIVE. Ports are chosen by
    the JVMs (``0``) and read from their logs, so parallel sessions cannot collide. Both are
    stopped by process group (the worker's group holds its executors) at the end.
    """
    import time
    import uuid

    from airflow_kafka_backpressure.engines.environment import pyspark_home, spark_submit_env
    from kbp_local.process import stop_session

    root = _TMP_ROOT / f"spark-standalone-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    java_tmp = root / "java-tmp"
    worker_dir = root / "worker"
    for d in (java_tmp, worker_dir):
        d.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(spark_submit_env(root, {"SPARK_LOCAL_IP": "127.0.0.1"}))
    env["SPARK_DAEMON_JAVA_OPTS"] = f"-Djava.io.tmpdir={java_tmp}"
    # the master's REST submission server would take the fixed port 6066; nothing here uses it
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    env.pop("SPARK_CONF_DIR", None)
    spark_class = str(Path(pyspark_home()) / "bin" / "spark-class")

    procs: list[subprocess.Popen] = []
    logs: list[object] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = root / f"{name}.log"
        f = open(log, "w")  # noqa: SIM115 - closed at teardown
        logs.append(f)
        proc = subprocess.Popen(
            [spark_class, *args],
            env=env,
            cwd=root,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(proc)
        return proc, log

    try:
        master, master_log = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
        )
        master_url = _wait_for_log(
            master,
            master_log,
            r"Starting Spark master at (spark://127\.0\.0\.1:\d+)",
            STANDALONE_START_TIMEOUT_S,
        )
        ui_port = _wait_for_log(
            master,
            master_log,
            r"Successfully started service 'MasterUI' on port (\d+)",
            STANDALONE_START_TIMEOUT_S,
        )
        web_ui_url = f"http://127.0.0.1:{ui_port}"
        worker, worker_log = start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            master_url,
            "--host",
            "127.0.0.1",
            "--cores",
            str(STANDALONE_WORKER_CORES),
            "--memory",
            STANDALONE_WORKER_MEMORY,
            "--webui-port",
            "0",
            "--work-dir",
            str(worker_dir),
        )
        cluster = StandaloneCluster(master_url, web_ui_url, "", root)
        deadline = time.monotonic() + STANDALONE_START_TIMEOUT_S
        while True:
            try:
                alive = [w for w in cluster.master_json().get("workers", []) if w.get("state") == "ALIVE"]
            except (OSError, ValueError):
                # not up yet: refused, or (ValueError: JSONDecodeError) the UI's port answers before its
                # /json/ page does, with an empty body: seen once when the machine was loaded
                alive = []
            if alive:
                cluster.worker_web_ui_url = alive[0]["webuiaddress"]
                break
            if worker.poll() is not None or master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"no ALIVE worker at {web_ui_url}/json:\n--- master ---\n"
                    f"{master_log.read_text(errors='replace')[-3000:]}\n--- worker ---\n"
                    f"{worker_log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.3)
        yield cluster
    finally:
        for proc in reversed(procs):  # worker (and its executors) first, then the master
            stop_session(proc, 30)
        for f in logs:
            f.close()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- Spark Connect server


@pytest.fixture(scope="session")
def spark_connect(spark_kafka_connector: str) -> Iterator[object]:
    """A Spark Connect server (``local[2]``) on 127.0.0.1 and a free port, for the whole session:
    the connect engine's embedded default (:class:`~kbp_local.spark_connect.SparkConnectServer`),
    with Spark's Kafka connector (the session's spark-defaults) and Delta Lake's jars and SQL
    extension (``local spark-connect --delta``; on the JVM's class path, so the defaults'
    ``spark.jars`` stays as it is), for the Delta sink on the connect engine. Stopped (its whole
    process group) at the end."""
    import uuid

    from kbp_local.jars import spark_delta_conf
    from kbp_local.spark_connect import SparkConnectServer
    from tests.local_servers import served

    root = _TMP_ROOT / f"spark-connect-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield from served(SparkConnectServer(root, conf=spark_delta_conf(jars="extraClassPath")), root)
