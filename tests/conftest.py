"""Shared test set-up.

Airflow reads its configuration when first imported, so the environment for a throw-away Airflow
home (SQLite metadata DB, no examples) is set here, at import time, before any test module imports
airflow. Temporary files stay inside the work tree (``.tmp/``), never in the system temp dir.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sys
from pathlib import Path

import pytest

from tests.local_servers import served

pytest_plugins = [
    "tests.fixtures_spark",
    "tests.fixtures_postgres",
    "tests.fixtures_registry",
    "tests.cpu_account",
]

REPO = Path(__file__).resolve().parents[1]
TMP_ROOT = REPO / ".tmp"
TMP_ROOT.mkdir(exist_ok=True)

_AIRFLOW_HOME = TMP_ROOT / f"airflow-home-{os.getpid()}"
if _AIRFLOW_HOME.exists():
    shutil.rmtree(_AIRFLOW_HOME)
_AIRFLOW_HOME.mkdir(parents=True)

_ENV = {
    "AIRFLOW_HOME": str(_AIRFLOW_HOME),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(_AIRFLOW_HOME / "dags"),
    "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(48),
    "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "SPARK_LOCAL_IP": "127.0.0.1",
    "TMPDIR": str(TMP_ROOT),
}
os.environ.update(_ENV)
# Every Spark JVM a test starts (spark-submit drivers, the local[2] session, the Connect server) is
# short-lived and small: the C1 compiler only and a serial GC. spark-submit drivers were 40% of the
# suite's CPU (2,540 s of 144 drivers in the 2026-11-27 rehearsal); these flags cut a Spark job
# test's CPU by a fifth at the same wall time on an idle machine (test_spark_job's three batches:
# 121 s → 95 s of CPU). Not the product's defaults: a long-running job wants C2. A user's own
# SPARK_SUBMIT_OPTS is kept. The session's first Spark fixture adds a class-data-sharing archive to
# them (tests/spark_class_archive.py: 40% off a spark-submit's wall time and CPU). The jars' bytecode
# is not verified (a diagnostic flag, silent, unlike the deprecated -Xverify:none): measured here on
# 2026-12-02, alone and paired with the same tests without it, a Delta-on-S3 pipeline test 82 → 71 s
# of CPU, the pipeline's three runs 61-69 → 57 s (spark-submit) and 44-51 → 40 s (Connect server).
_SPARK_TEST_JVM_OPTS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
    " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)
_OWN_SPARK_SUBMIT_OPTS = "SPARK_SUBMIT_OPTS" not in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", _SPARK_TEST_JVM_OPTS)
# The same for the Kafka brokers the tests start (kbp_local.apache_kafka reads KAFKA_OPTS, as
# Kafka's scripts do): measured here on 2026-11-30, a broker's start 7.4 → 4.0 s of CPU.
os.environ.setdefault("KAFKA_OPTS", _SPARK_TEST_JVM_OPTS)
# The venv's bin holds spark-submit: make it reachable even when the venv is not activated.
_bin = str(Path(sys.executable).parent)
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")


def pytest_configure(config: pytest.Config) -> None:
    if not config.option.basetemp:
        config.option.basetemp = str(TMP_ROOT / f"pytest-{os.getpid()}")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_kafka_connector() -> str:
    """Spark's Kafka connector and Avro functions for every Spark this session starts: their jars
    (fetched from Maven Central once into the jar cache) in the ``spark-defaults.conf`` of a ``SPARK_CONF_DIR`` set for
    the session, as a cluster's defaults would carry them. spark-submit, the local[2] session, the
    Connect server and the Airflow tasks all read it, so ``reader="auto"`` picks the native reader.
    Returns the folder."""
    from kbp_local.jars import (
        combined_spark_conf,
        spark_avro_conf,
        spark_kafka_conf,
        write_spark_defaults,
    )

    # one folder per content, shared by the suite's two pytest shards: a class-data-sharing archive
    # is valid only for JVMs whose class path (the conf dir first) is the one it was built with.
    # Spark's Avro functions too (one jar): the avro record decoder's from_avro
    conf = combined_spark_conf(spark_kafka_conf(), spark_avro_conf())
    # and the executors of a standalone cluster (the session's JVM flags; the product sets their
    # extraJavaOptions, which Spark appends to these)
    conf["spark.executor.defaultJavaOptions"] = _SPARK_TEST_JVM_OPTS
    digest = hashlib.sha256(repr(sorted(conf.items())).encode()).hexdigest()[:12]
    conf_dir = TMP_ROOT / f"spark-conf-{digest}"
    if not conf_dir.exists():
        partial = TMP_ROOT / f"spark-conf-{digest}.{os.getpid()}"
        write_spark_defaults(partial, conf)
        try:
            partial.rename(conf_dir)
        except OSError:  # the other shard was first, with the same content
            shutil.rmtree(partial, ignore_errors=True)
    if _OWN_SPARK_SUBMIT_OPTS and "SharedArchiveFile" not in os.environ["SPARK_SUBMIT_OPTS"]:
        from kbp_local.apache_kafka import java_binary
        from tests.spark_class_archive import java_home_without_conf_dir, shared_spark_class_archive

        java_home = java_home_without_conf_dir(TMP_ROOT, conf_dir, os.path.realpath(java_binary()))
        archive = shared_spark_class_archive(TMP_ROOT, _SPARK_TEST_JVM_OPTS, conf_dir, java_home)
        if archive is not None:
            os.environ["JAVA_HOME"] = str(java_home)
            # a JVM whose class path does not match runs without the archive: silently (it would
            # say so on its stdout); the java of java_home moves a spark.driver.extraClassPath,
            # which Spark puts first, to the end, so that the Delta and S3A tests' JVMs match
            os.environ["SPARK_SUBMIT_OPTS"] = (
                f"{_SPARK_TEST_JVM_OPTS} -XX:SharedArchiveFile={archive} -Xlog:cds*=off"
            )
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
    return str(conf_dir)


def _name_of_test(request: pytest.FixtureRequest, limit: int) -> str:
    """The test's name in letters, digits and hyphens, cut to ``limit``, with a random suffix."""
    base = "".join(c if c.isascii() and c.isalnum() else "-" for c in request.node.name)[:limit].strip("-")
    return f"{base}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def kafka_broker(spark_kafka_connector):
    """Apache Kafka (KRaft, one node) on 127.0.0.1 and free ports, for the whole session: a
    PLAINTEXT listener (``bootstrap``) and a SASL/SCRAM-over-TLS one (``secured_bootstrap``; users
    by ``add_scram_user``, client settings by ``secured_client_properties``)."""
    from kbp_local.apache_kafka import KafkaBroker

    work = TMP_ROOT / f"kafka-{os.getpid()}"
    yield from served(KafkaBroker(work, secured=True), work)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (the session broker is shared)."""
    return _name_of_test(request, 60)


@pytest.fixture(scope="session")
def s3_server():
    """SeaweedFS's S3 gateway (:class:`~kbp_local.s3.S3Server`) on 127.0.0.1
    and free ports, with its data under ``.tmp/``, for the whole session; tests take a bucket each
    (``s3_bucket``)."""
    from kbp_local.s3 import S3Server

    work = TMP_ROOT / f"s3-{os.getpid()}"
    yield from served(S3Server(work), work)


@pytest.fixture
def s3_bucket(s3_server, request: pytest.FixtureRequest) -> str:
    """A new bucket of the session's S3 server, named after the test (S3's rules: 3-63 characters
    of lower-case letters, digits and hyphens); returns its name."""
    name = _name_of_test(request, 48).lower()
    s3_server.create_bucket(name)
    return name
