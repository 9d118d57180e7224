"""Spark fixtures (session-scoped local[2] SparkSession, spark-submit environment).

* ``spark_work_dir`` — scratch directory for Spark (local dirs, java.io.tmpdir) under ``.tmp/``.
* ``spark`` — one local[2] SparkSession for the whole test session, configured like production
  (:mod:`airflow_kafka_backpressure.spark.environment`). Stopped at the end of the session.
* ``spark_submit`` — runs the real ``spark-submit`` command line the way the operator will:
  ``spark_submit(application, *app_args, py_files=[...], conf={...})`` → ``CompletedProcess``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
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
def spark(spark_work_dir: Path) -> Iterator[object]:
    from airflow_kafka_backpressure.spark.environment import spark_conf_defaults, spark_submit_env

    # The py4j gateway starts the JVM through spark-submit with this process's environment.
    saved = dict(os.environ)
    os.environ.update(spark_submit_env(spark_work_dir))
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(SPARK_MASTER).appName("kbp-tests")
    conf = spark_conf_defaults(spark_work_dir, {"spark.sql.shuffle.partitions": "2"})
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        _shutdown_gateway()
        os.environ.clear()
        os.environ.update(saved)


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
def spark_submit(spark_work_dir: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    from airflow_kafka_backpressure.spark.environment import spark_conf_defaults, spark_submit_env

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
            cmd, env=full_env, capture_output=True, text=True, timeout=SPARK_SUBMIT_TIMEOUT_S, cwd=spark_work_dir
        )

    return run
