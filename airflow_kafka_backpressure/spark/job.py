"""The bounded Spark job: read one batch's exact Kafka offset ranges, transform, write the sink.

Run it with ``spark-submit [--py-files airflow_kafka_backpressure-<v>.zip] job.py --spec spec.json``
(the spec is a :class:`~airflow_kafka_backpressure.models.JobSpec` as JSON), or call
:func:`run_batch` with an existing SparkSession. Steps:

1. check every range against the partition's earliest/latest offsets (kafka-python, driver side),
   before anything is read: a missing topic or partition, a range past the latest offset or below
   the earliest one, or an unreachable broker is a :class:`JobError` saying what to do;
2. read the ranges — ``reader="python"``: the :mod:`.kafka_range_source` Python Data Source;
   ``"native"``: Spark's ``format("kafka")`` with ``assign``/``startingOffsets``/``endingOffsets``;
   ``"auto"``: native when ``KafkaSourceProvider`` is on the JVM classpath, else python;
3. apply the optional user transform ``"package.module:function"`` (DataFrame -> DataFrame);
4. write the idempotent sink (:mod:`.sink`) — records are counted while they are written, with a
   Spark ``Observation`` on the data as read (before the transform), so Kafka is read once;
5. write :class:`~airflow_kafka_backpressure.models.BatchMetrics` JSON to ``spec.metrics_path`` and
   print ``KBP_METRICS {json}`` on stdout.

Metrics: ``records``/``bytes`` (key + value bytes) and per-partition counts are of the records
read. If the transform does not consume its input (e.g. returns an unrelated DataFrame) the
observation never completes; the job then counts with a second read. ``executors`` is 1 in local
mode (the driver JVM runs the tasks), otherwise the number of executors (driver excluded) the
status tracker reports, the larger of the counts before the read and after the write.

``spec.options`` understood here: ``max_records_per_batch`` (rows per Arrow batch of the Python
reader, default 10000), ``parquet_compression`` (Spark's Parquet ``compression`` option) and
``observation_wait_s`` (how long to wait for the write's record counts, default 10).

On failure ``main`` prints ``KBP_ERROR <message>`` on stderr and exits 1 (2 for a bad spec file).
This module never imports Airflow. The driver and the executors must be able to import
``airflow_kafka_backpressure``: in local mode the installed package suffices; otherwise ship
:func:`package_zip`'s zip with ``--py-files`` (it also carries this package to a cluster-mode
driver). kafka-python and pyarrow must be installed where the executors' Python runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow_kafka_backpressure.kafka_config import KafkaConfigError, to_kafka_python, to_spark_kafka_options
from airflow_kafka_backpressure.models import BatchMetrics, JobSpec, OffsetRange, PartitionCount, TopicPartition

log = logging.getLogger("airflow_kafka_backpressure.spark.job")

METRICS_PREFIX = "KBP_METRICS "
ERROR_PREFIX = "KBP_ERROR "
NATIVE_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
DEFAULT_BOOTSTRAP_TIMEOUT_MS = 20_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
OBSERVATION_WAIT_S = 10.0


class JobError(RuntimeError):
    """The batch cannot be run as specified; the message says what and what to do."""


# --------------------------------------------------------------------------- bounds


def range_problems(
    ranges: Sequence[OffsetRange],
    partitions: dict[str, set[int]],
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
) -> list[str]:
    """What is wrong with ``ranges`` given the topics' partitions and offsets (pure).

    An empty range is only checked for existing offsets (``until <= latest``): it reads nothing,
    so an old start below the earliest offset does no harm here.
    """
    problems = []
    for r in ranges:
        known = partitions.get(r.topic)
        if not known:
            problems.append(f"{r}: topic {r.topic!r} does not exist")
            continue
        if r.partition not in known:
            problems.append(
                f"{r}: topic {r.topic!r} has no partition {r.partition} (it has {sorted(known)})"
            )
            continue
        lo, hi = earliest[r.tp], latest[r.tp]
        if r.until_offset > hi:
            problems.append(
                f"{r}: ends past the latest offset {hi} of {r.tp} (earliest {lo}); offsets "
                f"[{max(hi, r.from_offset)}, {r.until_offset}) do not exist yet. The plan is wrong or "
                f"stale: re-plan this batch from the current offsets (until_offset must not exceed "
                f"the latest offset)"
            )
        elif r.count > 0 and r.from_offset < lo:
            problems.append(
                f"{r}: starts below the earliest offset {lo} of {r.tp}; offsets "
                f"[{r.from_offset}, {min(lo, r.until_offset)}) were deleted (retention) before they "
                f"were read. Re-plan this batch from offset {lo} and record the data loss"
            )
    return problems


def _client_config(spec: JobSpec) -> dict[str, Any]:
    try:
        cfg = to_kafka_python(spec.kafka, source="JobSpec.kafka")
    except KafkaConfigError as e:
        raise JobError(str(e)) from e
    cfg.setdefault("bootstrap_timeout_ms", DEFAULT_BOOTSTRAP_TIMEOUT_MS)
    cfg.setdefault("request_timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
    cfg.setdefault("client_id", f"kbp-job-{spec.plan.pipeline}")
    cfg.update(group_id=None, enable_auto_commit=False, allow_auto_create_topics=False)
    return cfg


def check_bounds(spec: JobSpec) -> dict[TopicPartition, tuple[int, int]]:
    """Check the plan's ranges against the brokers; (earliest, latest) per topic-partition.

    Raises :class:`JobError` for an unreachable broker (after ``bootstrap_timeout_ms``), a missing
    topic or partition, or a range outside ``[earliest, latest]``.
    """
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTP

    ranges = spec.plan.ranges
    if not ranges:
        return {}
    cfg = _client_config(spec)
    servers = cfg["bootstrap_servers"]
    try:
        consumer = KafkaConsumer(**cfg)
    except Exception as e:
        raise JobError(
            f"cannot reach Kafka at {servers!r} within {cfg['bootstrap_timeout_ms']} ms "
            f"({type(e).__name__}: {e}). Check bootstrap.servers, the network and the security "
            f"settings of the connection; set socket.connection.setup.timeout.ms to wait longer"
        ) from e
    try:
        partitions: dict[str, set[int]] = {}
        for topic in sorted({r.topic for r in ranges}):
            # Existence first: asking offsets of an unknown topic may auto-create it.
            partitions[topic] = set(consumer.partitions_for_topic(topic) or ())
        tps = [r.tp for r in ranges if r.partition in partitions.get(r.topic, ())]
        ktps = [KafkaTP(*tp) for tp in tps]
        try:
            lo = consumer.beginning_offsets(ktps) if ktps else {}
            hi = consumer.end_offsets(ktps) if ktps else {}
        except Exception as e:
            raise JobError(
                f"cannot list the earliest/latest offsets of {', '.join(map(str, tps))} at "
                f"{servers!r}: {type(e).__name__}: {e}. Check the broker's health and the "
                f"connection's permissions (Describe on the topics)"
            ) from e
    finally:
        consumer.close()
    earliest = {TopicPartition(k.topic, k.partition): int(v) for k, v in lo.items()}
    latest = {TopicPartition(k.topic, k.partition): int(v) for k, v in hi.items()}
    problems = range_problems(ranges, partitions, earliest, latest)
    if problems:
        raise JobError(
            f"batch {spec.plan.batch_id} of pipeline {spec.plan.pipeline!r} at {servers!r} cannot be "
            "read; nothing was written. " + "; ".join(problems)
        )
    return {tp: (earliest[tp], latest[tp]) for tp in tps}


# --------------------------------------------------------------------------- reading


def native_reader_available(spark: Any) -> bool:
    """True when Spark's Kafka connector (``spark-sql-kafka-0-10``) is on the driver classpath."""
    jvm = spark._jvm
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(NATIVE_PROVIDER_CLASS, False, loader)
        return True
    except Exception:
        return False


def choose_reader(spark: Any, reader: str) -> str:
    """``"python"`` or ``"native"`` for the spec's ``auto | python | native``."""
    if reader == "python":
        return "python"
    available = native_reader_available(spark)
    if reader == "native" and not available:
        raise JobError(
            f"reader='native' needs Spark's Kafka connector, but {NATIVE_PROVIDER_CLASS} is not on "
            "the classpath. Add the spark-sql-kafka-0-10 jar matching your Spark and Scala versions "
            "(--jars or spark.jars.packages), or use reader='auto' / 'python'"
        )
    return "native" if available else "python"


def native_options(spec: JobSpec) -> dict[str, str]:
    """Options for Spark's ``format("kafka")`` batch read of the plan's non-empty ranges."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in spec.plan.ranges:
        if r.count <= 0:
            continue
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    opts = to_spark_kafka_options(spec.kafka)
    opts.update(
        assign=json.dumps(assign),
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
        includeHeaders="true",
        failOnDataLoss="true",
    )
    return opts


def read_ranges(spark: Any, spec: JobSpec, reader: str) -> Any:
    """The batch's records as a DataFrame with the Kafka source schema (lazy)."""
    from airflow_kafka_backpressure.spark.kafka_range_source import (
        DEFAULT_MAX_RECORDS_PER_BATCH,
        KAFKA_SCHEMA,
        KafkaRangeDataSource,
        range_source_options,
    )

    if not any(r.count > 0 for r in spec.plan.ranges):
        return spark.createDataFrame([], KAFKA_SCHEMA)
    if reader == "native":
        return spark.read.format("kafka").options(**native_options(spec)).load()
    spark.dataSource.register(KafkaRangeDataSource)
    opts = range_source_options(
        spec.plan.ranges,
        spec.kafka,
        poll_timeout_ms=spec.poll_timeout_ms,
        stall_timeout_s=spec.stall_timeout_s,
        max_records_per_batch=int(spec.options.get("max_records_per_batch", DEFAULT_MAX_RECORDS_PER_BATCH)),
    )
    return spark.read.format(KafkaRangeDataSource.name()).options(**opts).load()


# --------------------------------------------------------------------------- transform


def load_transform(ref: str) -> Callable[[Any], Any]:
    """The function named by ``"package.module:function"``."""
    module_name, _, attr_path = ref.partition(":")
    if not module_name or not attr_path:
        raise JobError(f"transform {ref!r} must look like 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:
        raise JobError(
            f"transform {ref!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}). "
            "Install it where the driver runs, or ship it with --py-files"
        ) from e
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise JobError(f"transform {ref!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise JobError(f"transform {ref!r} is a {type(obj).__name__}, not a function")
    return obj


def apply_transform(df: Any, ref: str | None) -> Any:
    """``df`` passed through the transform ``ref`` (unchanged when None)."""
    if ref is None:
        return df
    from pyspark.sql import DataFrame

    fn = load_transform(ref)
    try:
        out = fn(df)
    except Exception as e:
        raise JobError(f"transform {ref!r} raised {type(e).__name__}: {e}") from e
    if not isinstance(out, DataFrame):
        raise JobError(
            f"transform {ref!r} returned {type(out).__name__}, not a DataFrame; it must take the "
            "batch's DataFrame and return a pyspark.sql.DataFrame"
        )
    return out


# --------------------------------------------------------------------------- counting


class _Counter:
    """Counts the records read (per topic-partition, and key+value bytes) during the write."""

    def __init__(self, raw: Any, ranges: Sequence[OffsetRange], wait_s: float = OBSERVATION_WAIT_S) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self.raw = raw
        self.wait_s = wait_s
        self.ranges = [r for r in ranges if r.count > 0]
        self.result: dict[TopicPartition, int] | None = None
        self.bytes = 0
        if not self.ranges:
            self.observed = raw
            self.observation = None
            self.result = {}
            return
        size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
        exprs = [F.sum(size).alias("bytes")]
        for i, r in enumerate(self.ranges):
            hit = (F.col("topic") == r.topic) & (F.col("partition") == r.partition)
            exprs.append(F.count_if(hit).alias(f"p{i}"))
        self.observation = Observation(f"kbp_count_{uuid.uuid4().hex}")
        self.observed = raw.observe(self.observation, *exprs)

    def _from_observation(self) -> bool:
        obs = self.observation
        deadline = time.monotonic() + self.wait_s
        while not obs._jo.future().isCompleted():  # noqa: SLF001 - no public non-blocking check
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        row = obs.get
        self.bytes = int(row["bytes"] or 0)
        self.result = {r.tp: int(row[f"p{i}"] or 0) for i, r in enumerate(self.ranges)}
        return True

    def _from_second_read(self) -> None:
        from pyspark.sql import functions as F

        log.warning("the transform did not consume the batch's records; counting them with a second read")
        size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
        grouped = self.raw.groupBy("topic", "partition").agg(F.count(F.lit(1)).alias("n"), F.sum(size).alias("b"))
        counts = {
            TopicPartition(row["topic"], int(row["partition"])): (int(row["n"]), int(row["b"] or 0))
            for row in grouped.collect()
        }
        self.result = {r.tp: counts.get(r.tp, (0, 0))[0] for r in self.ranges}
        self.bytes = sum(b for _, b in counts.values())

    def counts(self) -> dict[TopicPartition, int]:
        if self.result is None and not self._from_observation():
            self._from_second_read()
        assert self.result is not None
        return self.result


def count_executors(spark: Any) -> int:
    """1 in local mode; else the executors (driver excluded) the status tracker knows now."""
    sc = spark.sparkContext
    if sc.master.startswith("local"):
        return 1
    try:
        return max(0, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)
    except Exception:  # pragma: no cover - e.g. no JVM access
        return 0


# --------------------------------------------------------------------------- the batch


def _now_ms() -> int:
    return int(time.time() * 1000)


def _spark_failure(e: Exception) -> str:
    """The useful line of a Spark/Py4J error (an executor's KafkaRangeReadError, if any)."""
    text = str(e)
    for line in text.splitlines():
        if "KafkaRangeReadError:" in line:
            return line.split("KafkaRangeReadError:", 1)[1].strip()
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _set_session_defaults(spark: Any) -> None:
    from airflow_kafka_backpressure.spark.environment import PARQUET_TIMESTAMP_KEY, PARQUET_TIMESTAMP_VALUE

    if not spark.sparkContext.getConf().contains(PARQUET_TIMESTAMP_KEY):
        spark.conf.set(PARQUET_TIMESTAMP_KEY, PARQUET_TIMESTAMP_VALUE)


def write_metrics(spark: Any, path: str, metrics: BatchMetrics) -> None:
    """Metrics JSON to a local path (atomically) or any Hadoop URI."""
    text = json.dumps(metrics.to_dict(), sort_keys=True)
    scheme = urlparse(path).scheme
    if scheme in ("", "file"):
        local = Path(urlparse(path).path if scheme == "file" else path)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, local)
    else:
        from airflow_kafka_backpressure.spark.sink import write_text

        write_text(spark, path, text)


def run_batch(spark: Any, spec: JobSpec) -> BatchMetrics:
    """Run one batch in ``spark``; returns (and writes, and prints) its metrics.

    Raises :class:`JobError` with a message naming what failed; the sink then holds the batch's
    previous committed version, if any, and never a partial or duplicated one. Sets
    ``spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS`` on the session unless the
    application's configuration sets it.
    """
    from airflow_kafka_backpressure.spark.sink import SinkError, write_batch

    plan = spec.plan
    _set_session_defaults(spark)
    check_bounds(spec)
    reader = choose_reader(spark, spec.reader)
    executors_before = count_executors(spark)
    raw = read_ranges(spark, spec, reader)
    counter = _Counter(raw, plan.ranges, float(spec.options.get("observation_wait_s", OBSERVATION_WAIT_S)))
    out = apply_transform(counter.observed, spec.transform)

    def describe() -> dict[str, Any]:
        counts = counter.counts()
        return {
            "pipeline": plan.pipeline,
            "run_id": plan.run_id,
            "reader": reader,
            "transform": spec.transform,
            "ranges": [r.to_dict() for r in plan.ranges],
            "partitions": [
                {"topic": r.topic, "partition": r.partition, "records": counts.get(r.tp, 0)} for r in plan.ranges
            ],
            "records": sum(counts.values()),
            "bytes": counter.bytes,
        }

    read_started_at_ms = _now_ms()
    parquet_options = {}
    if "parquet_compression" in spec.options:
        parquet_options["compression"] = str(spec.options["parquet_compression"])
    try:
        manifest = write_batch(spark, out, plan.sink, plan.batch_id, describe, parquet_options=parquet_options)
    except SinkError as e:
        raise JobError(f"batch {plan.batch_id}: cannot commit to sink {plan.sink!r}: {e}") from e
    except JobError:
        raise
    except Exception as e:
        raise JobError(
            f"batch {plan.batch_id} of pipeline {plan.pipeline!r} failed while reading "
            f"{', '.join(str(r) for r in plan.ranges if r.count > 0)} (reader={reader}) or writing "
            f"{plan.output_path!r}: {_spark_failure(e)}"
        ) from e
    committed_at_ms = _now_ms()

    metrics = BatchMetrics(
        batch_id=plan.batch_id,
        records=int(manifest["records"]),
        bytes=int(manifest["bytes"]),
        launched_at_ms=spec.launched_at_ms,
        read_started_at_ms=read_started_at_ms,
        committed_at_ms=committed_at_ms,
        executors=max(executors_before, count_executors(spark)),
        partitions=tuple(PartitionCount.from_dict(p) for p in manifest["partitions"]),
    )
    write_metrics(spark, spec.metrics_path, metrics)
    print(METRICS_PREFIX + json.dumps(metrics.to_dict(), sort_keys=True), flush=True)
    return metrics


# --------------------------------------------------------------------------- packaging


def job_script_path() -> str:
    """This file: the application to pass to ``spark-submit``."""
    return str(Path(__file__).resolve())


def package_zip(dest_dir: str | os.PathLike[str]) -> str:
    """Zip the ``airflow_kafka_backpressure`` package for ``--py-files``; returns the zip's path.

    Byte-identical for identical sources (fixed timestamps, sorted entries), so it can be cached.
    """
    import airflow_kafka_backpressure as pkg

    root = Path(pkg.__file__).resolve().parent
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"airflow_kafka_backpressure-{pkg.__version__}.zip"
    tmp = dest / f".{target.name}.{uuid.uuid4().hex}.tmp"  # concurrent builders each rename a whole file
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    )
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for p in files:
            arcname = f"airflow_kafka_backpressure/{p.relative_to(root).as_posix()}"
            info = zipfile.ZipInfo(arcname, (1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, p.read_bytes())
    os.replace(tmp, target)
    return str(target)


# --------------------------------------------------------------------------- command line


def load_spec(path: str) -> JobSpec:
    try:
        return JobSpec.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError as e:
        raise JobError(f"spec file {path!r} does not exist") from e
    except (ValueError, KeyError, TypeError) as e:
        raise JobError(f"spec file {path!r} is not a valid JobSpec: {type(e).__name__}: {e}") from e


def _report_error(message: str) -> None:
    """One ``KBP_ERROR`` line (spark-submit merges the driver's stderr into its stdout)."""
    print(ERROR_PREFIX + " ".join(message.split()), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one bounded Kafka micro-batch on Spark.")
    parser.add_argument("--spec", required=True, help="path of the JobSpec JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(args.spec)
    except JobError as e:
        _report_error(str(e))
        return 2
    try:
        check_bounds(spec)  # fail fast, before the JVM starts; run_batch checks again just before reading
    except JobError as e:
        _report_error(str(e))
        return 1

    from pyspark.sql import SparkSession

    plan = spec.plan
    spark = SparkSession.builder.appName(f"kbp-{plan.pipeline}-batch-{plan.batch_id}").getOrCreate()
    try:
        run_batch(spark, spec)
        return 0
    except JobError as e:
        _report_error(str(e))
        return 1
    except Exception as e:
        traceback.print_exc()
        _report_error(f"batch {plan.batch_id}: {type(e).__name__}: {e}")
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
