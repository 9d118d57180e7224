"""A reader added from outside the package (here, a test) is one class and one registry line: the
pipelines file accepts its name, the batch job reads with it, and the Parquet sink's commit counts
what it read — no existing module names it.

The toy reader makes the batch's records itself (offset ``o`` of a partition has the value
``b"toy-<o>"``); the job still checks the ranges against the session's broker, where the topic
holds those offsets, and the session's local Spark runs it."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow.dataset as pads
import pytest

from airflow_kafka_backpressure.batch.models import JobSpec
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.spark import readers
from airflow_kafka_backpressure.spark.job import run_batch
from airflow_kafka_backpressure.spark.reader_base import Reader
from kbp_local.producer import ensure_topic, produce

from .test_spark_job import make_spec


class ToyReader(Reader):
    name: ClassVar[str] = "toy"

    def problem(self, spark: Any, spec: JobSpec) -> str | None:
        return None

    def read(self, spark: Any, spec: JobSpec, *, read_records_dir: str | None = None) -> Any:
        from airflow_kafka_backpressure.spark.kafka_range_source import KAFKA_SCHEMA

        rows = [
            (None, f"toy-{o}".encode(), r.topic, r.partition, o, None, 0, [])
            for r in spec.plan.ranges
            for o in range(r.from_offset, r.until_offset)
        ]
        return spark.createDataFrame(rows, KAFKA_SCHEMA)


@pytest.fixture
def toy_registered():
    readers.register(ToyReader)
    try:
        yield
    finally:
        readers.READERS.pop(ToyReader.name)


def test_a_registered_reader_is_accepted_by_the_pipeline_and_reads_the_batch(
    spark, kafka_broker, topic_name, tmp_path, toy_registered
):
    PipelineConfig(name="toys", topics=("t",), sink=str(tmp_path / "p"), reader="toy")  # accepted
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=2)  # 15 offsets per partition
    ranges = {(topic_name, 0): (0, 5), (topic_name, 1): (10, 13)}
    spec = make_spec(tmp_path, kafka_broker.bootstrap, 1, ranges, sink=tmp_path / "sink")
    spec = JobSpec.from_dict({**spec.to_dict(), "reader": "toy", "options": {"writer": "spark"}})

    metrics = run_batch(spark, spec)

    assert metrics.records == 8 and {(p.partition, p.records) for p in metrics.partitions} == {(0, 5), (1, 3)}
    table = pads.dataset(str(tmp_path / "sink"), format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("value").to_pylist()) == sorted(
        f"toy-{o}".encode() for o in [*range(0, 5), *range(10, 13)]
    )


def test_an_unregistered_reader_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match="reader = 'toy' is invalid: one of auto, native, python"):
        PipelineConfig(name="toys", topics=("t",), sink=str(tmp_path / "p"), reader="toy")
