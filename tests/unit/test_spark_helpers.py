"""Pure helpers of the Spark job: environment/conf defaults, range checks, packaging, schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from airflow_kafka_backpressure.batch.models import BatchPlan, JobSpec, OffsetRange, TopicPartition
from airflow_kafka_backpressure.engines.environment import (
    pyspark_home,
    spark_conf_defaults,
    spark_submit_env,
)
from airflow_kafka_backpressure.engines.submit import package_zip
from airflow_kafka_backpressure.spark.job import native_options, range_problems

# --------------------------------------------------------------------------- environment


def test_submit_env_defaults(tmp_path):
    env = spark_submit_env(tmp_path, environ={"PATH": "/usr/bin:/bin"})
    assert Path(env["SPARK_HOME"], "bin", "spark-submit").exists()
    assert env["SPARK_HOME"] == pyspark_home()
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert Path(env["SPARK_LOCAL_DIRS"]).is_dir() and Path(env["SPARK_LOCAL_DIRS"]).is_relative_to(
        tmp_path.resolve()
    )
    first = env["PATH"].split(os.pathsep)[0]
    assert Path(first, "spark-submit").exists()
    assert env["PATH"].endswith("/usr/bin:/bin")
    assert all(isinstance(v, str) for v in env.values())


def test_submit_env_user_and_inherited_values_win(tmp_path):
    env = spark_submit_env(
        tmp_path,
        {"PYSPARK_PYTHON": "/opt/py", "EXTRA": "1"},
        environ={"PATH": "/bin", "SPARK_HOME": "/opt/spark"},
    )
    assert env["PYSPARK_PYTHON"] == "/opt/py" and env["EXTRA"] == "1"
    assert "SPARK_HOME" not in env  # inherited from the process environment: left alone
    assert spark_submit_env(tmp_path, {"PATH": "/mine"}, environ={"PATH": "/bin"})["PATH"] == "/mine"
    assert "SPARK_LOCAL_IP" not in spark_submit_env(tmp_path, local_only=False, environ={})


def test_conf_defaults(tmp_path):
    conf = spark_conf_defaults(tmp_path)
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        tmpdir = conf[key].split("-Djava.io.tmpdir=")[1]
        assert Path(tmpdir).is_dir() and Path(tmpdir).is_relative_to(tmp_path.resolve())
    assert all(isinstance(v, str) for v in conf.values())


def test_conf_user_values_win_and_java_options_are_merged(tmp_path):
    conf = spark_conf_defaults(
        tmp_path,
        {
            "spark.ui.enabled": "true",
            "spark.driver.extraJavaOptions": "-Xss4m",
            "spark.executor.extraJavaOptions": "-Djava.io.tmpdir=/scratch",
        },
    )
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.driver.extraJavaOptions"].startswith("-Xss4m -Djava.io.tmpdir=")
    assert conf["spark.executor.extraJavaOptions"] == "-Djava.io.tmpdir=/scratch"
    remote = spark_conf_defaults(tmp_path, local_only=False)
    assert "spark.driver.host" not in remote and "spark.executor.extraJavaOptions" not in remote


# --------------------------------------------------------------------------- range checks

TP0 = TopicPartition("t", 0)


def _problems(*ranges, earliest=5, latest=10):
    return range_problems(list(ranges), {"t": {0}}, {TP0: earliest}, {TP0: latest})


def test_ranges_inside_the_bounds_are_fine():
    assert _problems(OffsetRange("t", 0, 5, 10)) == []
    assert _problems(OffsetRange("t", 0, 10, 10)) == []  # empty, at the end
    assert _problems(OffsetRange("t", 0, 2, 2)) == []  # empty, below earliest: reads nothing


def test_range_past_latest():
    [p] = _problems(OffsetRange("t", 0, 8, 12))
    assert "t-0[8, 12)" in p and "latest offset 10" in p and "[10, 12) do not exist" in p and "re-plan" in p


def test_range_below_earliest():
    [p] = _problems(OffsetRange("t", 0, 1, 7))
    assert "earliest offset 5" in p and "[1, 5) were deleted" in p and "from offset 5" in p


def test_missing_topic_and_partition():
    assert "topic 'u' does not exist" in range_problems([OffsetRange("u", 0, 0, 1)], {"u": set()}, {}, {})[0]
    [p] = range_problems([OffsetRange("t", 3, 0, 1)], {"t": {0, 1}}, {}, {})
    assert "no partition 3 (it has [0, 1])" in p


# --------------------------------------------------------------------------- native reader options


def test_native_options_cover_only_non_empty_ranges():
    plan = BatchPlan(
        "p",
        1,
        "r",
        (OffsetRange("a", 0, 3, 9), OffsetRange("a", 2, 4, 4), OffsetRange("b", 1, 0, 5)),
        "/s",
        1000,
        0,
    )
    kafka = {"bootstrap.servers": "h:9092", "sasl.username": "u"}
    spec = JobSpec(plan=plan, kafka=kafka, launched_at_ms=0, stall_timeout_s=45)
    opts = native_options(spec)
    assert json.loads(opts["assign"]) == {"a": [0], "b": [1]}
    assert json.loads(opts["startingOffsets"]) == {"a": {"0": 3}, "b": {"1": 0}}
    assert json.loads(opts["endingOffsets"]) == {"a": {"0": 9}, "b": {"1": 5}}
    assert opts["kafka.bootstrap.servers"] == "h:9092" and "kafka.sasl.jaas.config" in opts
    assert opts["includeHeaders"] == "true"
    assert opts["kafkaConsumer.pollTimeoutMs"] == "45000"  # the spec's stall timeout
    assert (
        opts["kafka.max.poll.records"] == "10000"
    )  # the reader's fetch sizes, unless the connection sets them
    # a prefetch past a range's end is not held for the Java client's 500 ms: Spark's reader
    # waits behind it for its offset look-ups on the same connection
    assert opts["kafka.fetch.max.wait.ms"] == "10"
    tuned = native_options(
        JobSpec(
            plan=plan, kafka={**kafka, "max.poll.records": 50, "fetch.max.wait.ms": 200}, launched_at_ms=0
        )
    )
    assert tuned["kafka.max.poll.records"] == "50" and tuned["kafka.fetch.max.wait.ms"] == "200"


# --------------------------------------------------------------------------- packaging


def test_package_zip_is_importable_and_reproducible(tmp_path):
    z = package_zip(tmp_path)
    first = Path(z).read_bytes()
    assert Path(package_zip(tmp_path)).read_bytes() == first
    names = zipfile.ZipFile(z).namelist()
    assert "airflow_kafka_backpressure/batch/models.py" in names
    assert "airflow_kafka_backpressure/spark/job.py" in names
    assert not [n for n in names if "__pycache__" in n]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import airflow_kafka_backpressure.spark.kafka_range_source as m; print(m.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code, z], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(z)


# --------------------------------------------------------------------------- schema


def test_arrow_schema_is_what_spark_expects_for_the_kafka_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    from airflow_kafka_backpressure.spark.kafka_range_source import KAFKA_ARROW_SCHEMA, KAFKA_SCHEMA

    # The Python Data Source runner converts with timezone="UTC" and compares with .equals().
    assert to_arrow_schema(KAFKA_SCHEMA, timezone="UTC").equals(KAFKA_ARROW_SCHEMA)
    assert all(f.nullable for f in KAFKA_SCHEMA.fields)  # as in Spark's Kafka source


# --------------------------------------------------------------------------- error texts


def test_a_jvm_exception_py4j_wraps_is_named_by_its_own_line():
    """pyspark leaves JVM exceptions it does not know (Delta's) as py4j's error, whose first line
    names only the call: the batch's error names the JVM exception instead."""
    from airflow_kafka_backpressure.spark.job import _spark_failure

    text = (
        "An error occurred while calling o96.save.\n"
        ": io.delta.exceptions.ProtocolChangedException: [DELTA_PROTOCOL_CHANGED] ProtocolChangedException: "
        "The protocol version of the Delta table has been changed by a concurrent update.\n"
        "\tat org.apache.spark.sql.delta.ConflictChecker.checkProtocolCompatibility(ConflictChecker.scala:301)\n"
    )
    assert _spark_failure(RuntimeError(text)).startswith(
        "io.delta.exceptions.ProtocolChangedException: [DELTA_"
    )
    assert _spark_failure(RuntimeError("plain failure\nmore")) == "plain failure"


def test_deltas_refusals_of_a_concurrent_commit_are_told_from_other_failures():
    from airflow_kafka_backpressure.sinks.delta import _is_concurrent_commit

    for text in (
        ": io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND] Files were added",
        "[DELTA_METADATA_CHANGED] MetadataChangedException: The metadata of the Delta table has been changed",
        "[DELTA_CONCURRENT_TRANSACTION] ConcurrentTransactionException: This error occurs when",
        "[DELTA_PROTOCOL_CHANGED] ProtocolChangedException: The protocol version",
    ):
        assert _is_concurrent_commit(RuntimeError(text)), text
    for text in ("[DELTA_MISSING_DELTA_TABLE] is not a Delta table", "java.io.IOException: No space left"):
        assert not _is_concurrent_commit(RuntimeError(text)), text
