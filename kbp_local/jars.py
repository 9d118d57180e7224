"""Java artifacts from Maven Central, fetched once into a cache: Apache Kafka's broker and Spark's
Kafka connector.

A *bundle* is a set of Maven coordinates whose runtime classpath lands in one folder of the cache
(``$KBP_JARS_CACHE``, default ``~/.cache/airflow-kafka-backpressure/jars``), named after the
coordinates, so a second call (or process) downloads nothing. Maven resolves it: a small POM is
written into a temporary folder and ``mvn dependency:copy-dependencies`` copies the classpath there;
the folder is renamed into place once complete, under a file lock, so concurrent first uses fetch
once and never see half a folder.

* :func:`kafka_broker_jars` — ``org.apache.kafka:kafka_2.13`` (KRaft broker and ``StorageTool``)
  and ``kafka-tools`` (the classes behind Kafka's ``bin/kafka-*.sh``), with a log4j2 binding (the broker declares its logging backend compile-only) and the slf4j 2 API
  that binding needs;
* :func:`spark_kafka_jars` — ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed
  pyspark's version, minus the jars pyspark already ships (Scala, Hadoop client, slf4j, …): what
  ``spark.jars`` needs for ``format("kafka")``;
* :func:`hadoop_aws_jars` — ``org.apache.hadoop:hadoop-aws`` at the Hadoop version pyspark ships
  (its ``hadoop-client-api`` jar), with the AWS SDK v2 bundle it needs, minus what pyspark ships:
  what ``spark.jars`` needs for ``s3a://`` paths;
* :func:`delta_jars` — ``io.delta:delta-spark_2.13`` (Delta Lake, built against the installed
  pyspark's Spark) with ``delta-storage`` and what else it needs that pyspark does not ship: what
  ``spark.jars`` needs for ``format("delta")``; :func:`spark_delta_conf` adds Delta's SQL extension
  and catalog;
* :func:`spark_avro_conf` — ``org.apache.spark:spark-avro_2.13`` at pyspark's version (``from_avro``).

Maven (``mvn``) must be on PATH; Maven's own repository (``~/.m2``) caches the downloads too.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.engines.environment import pyspark_home

#: Apache Kafka release of the embedded broker (``KBP_KAFKA_VERSION`` overrides it).
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.25.2"
SLF4J_VERSION = "2.0.17"
SCALA_BINARY = "2.13"
#: Delta Lake release of the Delta sink per Spark minor (``KBP_DELTA_VERSION`` overrides it), each
#: built against that Spark (its POM's spark-sql): 4.4.0 against Spark 4.2.0, 4.3.1 against 4.1, 4.0.0
#: against 4.0. PyPI's delta-spark 4.4.1 has no jar on Maven Central.
DELTA_VERSIONS = {"4.0": "4.0.0", "4.1": "4.3.1", "4.2": "4.4.0"}
#: The release of pyspark (and pyspark-client) tested for each supported Spark minor (the keys of
#: :data:`DELTA_VERSIONS` too): the newest whose Kafka connector (with its token provider),
#: spark-avro and pyspark-client are all served by the Maven Central mirror and PyPI that CI reaches
#: (the mirror has spark-token-provider-kafka 4.0.0, not 4.0.1 or 4.0.2; docs/versions.md). Pinned
#: by constraints/spark-<minor>.txt (scripts/spark_constraints.py), run by scripts/spark_leg.sh.
SPARK_RELEASES = {"4.0": "4.0.0", "4.1": "4.1.1", "4.2": "4.2.0"}
FETCH_TIMEOUT_S = 900

_JAR_VERSION = re.compile(r"-\d[\w.\-]*\.jar$")


class JarsError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(
        os.environ.get("KBP_JARS_CACHE") or Path.home() / ".cache" / "airflow-kafka-backpressure" / "jars"
    )


def kafka_version() -> str:
    return os.environ.get("KBP_KAFKA_VERSION") or KAFKA_VERSION


def artifact_name(jar: str) -> str:
    """``kafka-clients`` for ``kafka-clients-3.9.2.jar``: the jar's name without its version."""
    return _JAR_VERSION.sub("", jar)


def pom(coordinates: Sequence[str]) -> str:
    """A POM whose dependencies are ``group:artifact:version`` coordinates."""
    deps = []
    for coord in coordinates:
        parts = coord.split(":")
        if len(parts) != 3 or not all(parts):
            raise JarsError(f"Maven coordinates must be group:artifact:version, got {coord!r}")
        g, a, v = parts
        deps.append(
            f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>airflow-kafka-backpressure</groupId><artifactId>jar-bundle</artifactId>"
        "<version>1</version><packaging>pom</packaging>\n"
        "  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</project>\n"
    )


def bundle(name: str, coordinates: Sequence[str], *, provided: Iterable[str] = ()) -> Path:
    """The folder of jars of ``coordinates`` and their runtime dependencies, fetched on first use.

    Jars whose artifact name (:func:`artifact_name`) is in ``provided`` are left out: they are on
    the classpath already. Raises :class:`JarsError` naming Maven's output when the fetch fails.
    """
    key = hashlib.sha256("\n".join([*coordinates, "--", *sorted(provided)]).encode()).hexdigest()[:12]
    root = cache_root()
    final = root / f"{name}-{key}"
    if (final / ".complete").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():  # fetched by another process while we waited
            return final
        _fetch(name, coordinates, set(provided), root, final)
    return final


def _fetch(name: str, coordinates: Sequence[str], provided: set[str], root: Path, final: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(
            f"fetching the {name} jars needs Maven: install it (Debian: apt-get install maven) "
            f"or put the jars of {', '.join(coordinates)} into {final} with an empty .complete file"
        )
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        (work / "pom.xml").write_text(pom(coordinates))
        out = work / "jars"
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, cwd=work)
        except subprocess.TimeoutExpired as e:
            raise JarsError(f"Maven did not fetch the {name} jars within {FETCH_TIMEOUT_S} s") from e
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-3000:]
            raise JarsError(f"Maven could not fetch the {name} jars ({', '.join(coordinates)}):\n{tail}")
        for jar in list(out.glob("*.jar")):
            if artifact_name(jar.name) in provided:
                jar.unlink()
        (out / ".complete").write_text("\n".join(coordinates) + "\n")
        if final.exists():  # an incomplete folder left by a killed fetch
            shutil.rmtree(final)
        out.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def jar_paths(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.jar"))


def kafka_broker_jars(version: str | None = None) -> Path:
    """Apache Kafka's broker and tools classpath (KRaft), with a log4j2 binding."""
    version = version or kafka_version()
    coordinates = [
        f"org.apache.kafka:kafka_{SCALA_BINARY}:{version}",
        # Kafka's command-line tools (kafka-consumer-groups, kafka-topics, …), as its scripts run them
        f"org.apache.kafka:kafka-tools:{version}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
        f"org.apache.logging.log4j:log4j-slf4j2-impl:{LOG4J_VERSION}",
        # nearest-wins would otherwise keep the broker's slf4j 1.7 API, which the binding cannot serve
        f"org.slf4j:slf4j-api:{SLF4J_VERSION}",
    ]
    return bundle(f"kafka-{version}", coordinates)


def spark_kafka_coordinates(spark_version: str | None = None) -> str:
    """``org.apache.spark:spark-sql-kafka-0-10_2.13:<version>`` for the installed pyspark: what a
    cluster's ``spark.jars.packages`` names."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{spark_version}"


def pyspark_jars_dir() -> Path:
    """The installed pyspark's ``jars`` folder (Spark's classpath)."""

    return Path(pyspark_home()) / "jars"


def pyspark_shipped() -> set[str]:
    """Artifact names (:func:`artifact_name`) of the jars the installed pyspark ships."""
    return {artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar")}


def spark_kafka_jars(spark_version: str | None = None) -> Path:
    """Spark's Kafka connector and the dependencies pyspark does not ship."""
    coordinates = spark_kafka_coordinates(spark_version)
    return bundle(f"spark-kafka-{coordinates.rsplit(':', 1)[1]}", [coordinates], provided=pyspark_shipped())


def spark_kafka_conf(spark_version: str | None = None) -> dict[str, str]:
    """Spark settings that put the connector's cached jars on a job's classpath (``spark.jars``)."""
    return {"spark.jars": ",".join(jar_paths(spark_kafka_jars(spark_version)))}


def spark_avro_conf(spark_version: str | None = None, *, jars: str | None = "spark.jars") -> dict[str, str]:
    """Spark's Avro functions (``org.apache.spark:spark-avro_2.13`` at pyspark's version: ``from_avro``
    of the avro record decoder) on a job's classpath, as :func:`jars_conf` puts them; one jar
    (pyspark ships Avro itself)."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    coordinates = f"org.apache.spark:spark-avro_{SCALA_BINARY}:{spark_version}"
    return jars_conf(
        lambda: bundle(f"spark-avro-{spark_version}", [coordinates], provided=pyspark_shipped()), jars
    )


def pyspark_hadoop_version() -> str:
    """The Hadoop version the installed pyspark ships: ``3.5.0`` for ``hadoop-client-api-3.5.0.jar``
    in its ``jars`` folder (hadoop-aws must match it exactly)."""
    jars = pyspark_jars_dir()
    found = sorted(p.name for p in jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise JarsError(
            f"no hadoop-client-api jar in {jars}: cannot tell which hadoop-aws matches this pyspark"
        )
    return found[-1][len("hadoop-client-api-") : -len(".jar")]


def hadoop_aws_coordinates(hadoop_version: str | None = None) -> str:
    """``org.apache.hadoop:hadoop-aws:<version>`` at pyspark's Hadoop version: what a cluster's
    ``spark.jars.packages`` names for ``s3a://``."""
    return f"org.apache.hadoop:hadoop-aws:{hadoop_version or pyspark_hadoop_version()}"


def hadoop_aws_jars(hadoop_version: str | None = None) -> Path:
    """Hadoop's S3A filesystem (``hadoop-aws``) and what it needs that pyspark does not ship: for
    Hadoop 3.5.0, the AWS SDK v2 ``bundle`` 2.35.4 (~650 MB: every AWS service client, shaded), the
    S3 analytics accelerator and wildfly-openssl."""
    coordinates = hadoop_aws_coordinates(hadoop_version)
    return bundle(f"hadoop-aws-{coordinates.rsplit(':', 1)[1]}", [coordinates], provided=pyspark_shipped())


def jars_conf(folder: Callable[[], Path], jars: str | None) -> dict[str, str]:
    """The settings that put the jars of a bundle (``folder()``, fetched only when needed) on a
    Spark application's class path: ``"spark.jars"``, ``"extraClassPath"`` (driver and executors)
    or None (nothing: already there)."""
    if jars is None:
        return {}
    if jars not in ("spark.jars", "extraClassPath"):
        raise ValueError(f"jars must be 'spark.jars', 'extraClassPath' or None, got {jars!r}")
    paths = jar_paths(folder())
    if jars == "spark.jars":
        return {"spark.jars": ",".join(paths)}
    return {
        "spark.driver.extraClassPath": os.pathsep.join(paths),
        "spark.executor.extraClassPath": os.pathsep.join(paths),
    }


#: Spark settings that list jars: joined (by this separator) when settings are combined, not replaced.
_JAR_LISTS = {
    "spark.jars": ",",
    "spark.driver.extraClassPath": os.pathsep,
    "spark.executor.extraClassPath": os.pathsep,
}


def combined_spark_conf(*confs: dict[str, str]) -> dict[str, str]:
    """Several Spark settings of this module in one (Delta and S3A, say): the jar lists
    (``spark.jars``, the driver's and executors' ``extraClassPath``) joined in order, every other
    key taken from the last that sets it."""
    out: dict[str, str] = {}
    for conf in confs:
        for key, value in conf.items():
            sep = _JAR_LISTS.get(key)
            if sep and out.get(key):
                out[key] = sep.join(part for part in (out[key], value) if part)
            else:
                out[key] = value
    return out


def spark_s3a_conf(server: Any, *, jars: str | None = "spark.jars") -> dict[str, str]:
    """Spark settings for ``s3a://`` paths on an S3-compatible ``server`` (an object with
    ``endpoint``, ``access_key``, ``secret_key`` and ``region``, like
    :class:`~kbp_local.s3.S3Server`), as a user would configure them:
    Hadoop's S3A filesystem, the endpoint over plain HTTP with path-style URLs (no bucket host
    names), static credentials (no environment or instance-metadata lookups).

    ``jars`` puts :func:`hadoop_aws_jars` on the classpath: ``"spark.jars"`` (portable to any
    cluster, but every application copies them — the AWS SDK bundle is ~650 MB — into its scratch
    directory, local mode included), ``"extraClassPath"`` (the driver's and executors' JVM class
    path: nothing copied, but the paths must exist on every host), or None (already there).
    """
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint": server.endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": server.region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": server.access_key,
        "spark.hadoop.fs.s3a.secret.key": server.secret_key,
    }
    return {**conf, **jars_conf(hadoop_aws_jars, jars)}


def delta_version(spark_version: str | None = None) -> str:
    """The Delta Lake release for ``spark_version`` (default: the installed pyspark's), from
    :data:`DELTA_VERSIONS`; ``KBP_DELTA_VERSION`` overrides it."""
    if os.environ.get("KBP_DELTA_VERSION"):
        return os.environ["KBP_DELTA_VERSION"]
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    minor = ".".join(spark_version.split(".")[:2])
    if minor not in DELTA_VERSIONS:
        raise JarsError(
            f"no Delta Lake release is known here for Spark {spark_version} (known: "
            f"{', '.join(sorted(DELTA_VERSIONS))}); set KBP_DELTA_VERSION to a delta-spark built against it"
        )
    return DELTA_VERSIONS[minor]


def delta_coordinates(version: str | None = None) -> str:
    """``io.delta:delta-spark_2.13:<version>``: what a cluster's ``spark.jars.packages`` names."""
    return f"io.delta:delta-spark_{SCALA_BINARY}:{version or delta_version()}"


def delta_jars(version: str | None = None) -> Path:
    """Delta Lake for Spark (``delta-spark``) with ``delta-storage`` (its LogStores) and the rest of
    its runtime classpath that pyspark does not ship."""
    coordinates = delta_coordinates(version)
    return bundle(f"delta-{coordinates.rsplit(':', 1)[1]}", [coordinates], provided=pyspark_shipped())


def spark_delta_conf(version: str | None = None, *, jars: str | None = "spark.jars") -> dict[str, str]:
    """Spark settings for Delta tables: Delta's SQL extension (``DESCRIBE HISTORY``, ``DELETE``, …)
    and its catalog, with :func:`delta_jars` via ``spark.jars``, ``extraClassPath`` or not at all
    (``jars=None``: already on the classpath), as in :func:`spark_s3a_conf`."""
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    return {**conf, **jars_conf(lambda: delta_jars(version), jars)}


def write_spark_defaults(conf_dir: str | os.PathLike[str], conf: dict[str, str]) -> Path:
    """Write ``spark-defaults.conf`` into ``conf_dir`` (a ``SPARK_CONF_DIR``): every spark-submit,
    PySpark session and Connect server started with that ``SPARK_CONF_DIR`` gets ``conf``."""
    path = Path(conf_dir) / "spark-defaults.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} {v}\n" for k, v in sorted(conf.items())))
    return path
