"""``native``: Spark's own Kafka source (``format("kafka")``, the ``spark-sql-kafka-0-10`` connector),
read with ``assign``/``startingOffsets``/``endingOffsets`` through its DataSource V2 scan."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec
from airflow_kafka_backpressure.kafka.config import KafkaConfigError, to_spark_kafka_options
from airflow_kafka_backpressure.spark.errors import JobError
from airflow_kafka_backpressure.spark.reader_base import Reader
from airflow_kafka_backpressure.spark.session_secrets import plan_properties

NATIVE_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
#: Spark's Kafka consumer fetches as the Python reader's does (range_clients.CONFLUENT_FETCH_DEFAULTS):
#: larger fetches and polls than the Java client's defaults (1 MiB per partition, 500 records per
#: poll). Interleaved here, 300,000 records into a noop sink: 1.35-1.62 s against 1.53-2.03 s.
#:
#: ``fetch.max.wait.ms`` 10 instead of 500: a batch reads ranges that are already on the broker, so
#: only the client's prefetch past a range's end finds nothing, and the broker holds that fetch for
#: ``fetch.max.wait.ms``. Spark's reader asks for the partition's earliest and latest offsets after
#: every poll, on the same connection, and the broker answers a connection's requests in order: a
#: range that ends at the log end (every batch of a pipeline that keeps up) waited the whole 500 ms
#: per partition, whenever the last poll emptied the client's buffer. Measured here, 25 records from
#: each of 4 partitions at their log end into a noop sink: 1.21-1.32 s against 0.21-0.34 s; a
#: million records with max.poll.records 100,000 (every poll empties the buffer): 1.72-2.29 s
#: against 0.75-1.16 s. With 10,000 the stall depends on how the producer's batches fall against
#: the polls, so it came and went from one topic to the next (docs/benchmarks.md).
#:
#: The connection's own settings win.
NATIVE_FETCH_DEFAULTS = {
    "kafka.max.partition.fetch.bytes": str(4 * 1024 * 1024),
    "kafka.fetch.max.bytes": str(16 * 1024 * 1024),
    "kafka.max.poll.records": "10000",
    "kafka.fetch.max.wait.ms": "10",
}


def native_reader_available(spark: Any) -> bool:
    """True when Spark's Kafka connector (``spark-sql-kafka-0-10``) is on the driver's classpath:
    a classic session looks the provider class up; a Spark Connect session asks the server to
    resolve ``format("kafka")`` without options, which asks for its options when the connector is
    there and fails to find the data source when it is not. Nothing connects to Kafka."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return _connect_has_kafka_source(spark)
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(NATIVE_PROVIDER_CLASS, False, loader)
        return True
    except Exception:
        return False


#: The Connect probe's answer per server session (a kept session serves many batches; the probe is
#: a failed analysis, ~0.5-1 s with the server's stack trace).
_CONNECT_PROBES: dict[str, bool] = {}


def _connect_has_kafka_source(spark: Any) -> bool:
    session = getattr(spark, "session_id", None)
    if session is not None and session in _CONNECT_PROBES:
        return _CONNECT_PROBES[session]
    found = _probe_kafka_source(spark)
    if session is not None:
        _CONNECT_PROBES[session] = found
    return found


def _probe_kafka_source(spark: Any) -> bool:
    try:
        spark.read.format("kafka").load().schema  # noqa: B018 - the analysis is the probe
    except Exception as e:
        # found, the source refuses the missing options ("... must be specified for Kafka source")
        return "for Kafka source" in str(e)
    return True


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
    try:
        kafka = to_spark_kafka_options(
            plan_properties(spec.kafka, spec.secrets_file), source="the Kafka connection"
        )
    except KafkaConfigError as e:
        raise JobError(f"reader='native': {e}") from e
    opts = {**NATIVE_FETCH_DEFAULTS, **kafka}
    opts.update(
        assign=json.dumps(assign),
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
        includeHeaders="true",
        failOnDataLoss="true",
        # a read that gets nothing for this long fails (the Python reader's stall timeout)
        **{"kafkaConsumer.pollTimeoutMs": str(int(spec.stall_timeout_s * 1000))},
    )
    return opts


#: Spark's session setting naming the sources read through their DataSource V1 relation.
V1_SOURCES_CONF = "spark.sql.sources.useV1SourceList"


def read_kafka_through_v2(spark: Any) -> None:
    """Take ``kafka`` out of the session's ``spark.sql.sources.useV1SourceList`` (in it by default),
    so that ``format("kafka")`` batch reads go through the connector's DataSource V2 scan.

    Both read the same offsets with the same consumer and options; the V1 relation hands its rows to
    Spark as external ``Row`` objects, converted from and back to Spark's internal rows one by one.
    Profiled here (JFR, a million records into Parquet): the V2 scan takes about a fifth less of the
    executors' CPU. The batch's session is the job's own (a spark-submit driver, or this client's
    session on a Connect server); the other sources in the list keep their setting."""
    current = spark.conf.get(V1_SOURCES_CONF)
    sources = [s for s in current.split(",") if s.strip()]
    kept = [s for s in sources if s.strip().lower() != "kafka"]
    if kept != sources:
        spark.conf.set(V1_SOURCES_CONF, ",".join(kept))


class NativeReader(Reader):
    """Spark's Kafka source; Spark's own consumers on the executors."""

    name: ClassVar[str] = "native"

    def problem(self, spark: Any, spec: JobSpec) -> str | None:
        if spec.secrets_file is not None:
            return (
                "reader='native' cannot read this batch on the connect engine: the Kafka connection gives its "
                "credentials (sasl.password, ssl.key.password) as values, the connect engine puts no credential "
                "into a Spark Connect plan (the server shows plans in its UI and event log), and Spark's Kafka "
                "connector takes credentials only from its options or from the Spark hosts. Either keep the "
                "secret on the Spark hosts and the Airflow workers and name it in the connection "
                '(e.g. "sasl.password": "${dir:/var/run/secrets/kafka:password}" or "${env:KAFKA_PASSWORD}"), '
                "or set reader to 'auto' or 'python' (the Python reader receives them apart from the plans)"
            )
        if not native_reader_available(spark):
            return (
                f"reader='native' needs Spark's Kafka connector, but {NATIVE_PROVIDER_CLASS} is not on "
                "the classpath. Add the spark-sql-kafka-0-10 jar matching your Spark and Scala versions "
                "(--jars or spark.jars.packages), or use reader='auto' / 'python'"
            )
        return None

    def read(self, spark: Any, spec: JobSpec, *, read_records_dir: str | None = None) -> Any:
        read_kafka_through_v2(spark)
        return spark.read.format("kafka").options(**native_options(spec)).load()
