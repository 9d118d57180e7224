"""``python``: the Python Data Source (:mod:`.kafka_range_source`), reading each range with
confluent-kafka or kafka-python in Spark's Python workers; large ranges split to reach the batch's
read parallelism. It leaves a completion record per input partition read to its end, and can take
the batch's credentials from a Spark Connect session's file (:mod:`.session_secrets`)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_kafka_backpressure.batch.models import JobSpec
from airflow_kafka_backpressure.sinks import data_sources as registry
from airflow_kafka_backpressure.spark.reader_base import Reader
from airflow_kafka_backpressure.spark.session_secrets import plan_properties


def reader_settings(spec: JobSpec) -> dict[str, Any]:
    """The Python reader's settings for ``spec`` (keyword arguments of
    :func:`.kafka_range_source.range_source_options` and :func:`.arrow_writer.write_ranges`)."""
    from airflow_kafka_backpressure.spark.kafka_range_source import (  # defers pyspark
        DEFAULT_ARROW_BATCH_ROWS,
        DEFAULT_CLIENT,
        DEFAULT_MAX_RECORDS_PER_PARTITION,
    )

    o = spec.options
    return {
        "client": str(o.get("client", DEFAULT_CLIENT)),
        "min_partitions": spec.min_partitions,
        "max_records_per_partition": int(
            o.get("max_records_per_partition", DEFAULT_MAX_RECORDS_PER_PARTITION)
        ),
        "poll_timeout_ms": spec.poll_timeout_ms,
        "stall_timeout_s": spec.stall_timeout_s,
        "max_records_per_batch": int(o.get("arrow_batch_rows", DEFAULT_ARROW_BATCH_ROWS)),
    }


class PythonReader(Reader):
    name: ClassVar[str] = "python"
    leaves_completion_records: ClassVar[bool] = True
    feeds_arrow_writer: ClassVar[bool] = True

    def problem(self, spark: Any, spec: JobSpec) -> str | None:
        return None  # needs only pyarrow and a Kafka client on the executors

    def read(self, spark: Any, spec: JobSpec, *, read_records_dir: str | None = None) -> Any:
        from airflow_kafka_backpressure.spark.kafka_range_source import (  # defers pyspark
            KafkaRangeDataSource,
            range_source_options,
        )

        registry.register(spark, KafkaRangeDataSource)
        opts = range_source_options(
            spec.plan.ranges,
            plan_properties(spec.kafka, spec.secrets_file),
            read_records_dir=read_records_dir,
            secrets_file=spec.secrets_file,
            **reader_settings(spec),
        )
        return spark.read.format(KafkaRangeDataSource.name()).options(**opts).load()
