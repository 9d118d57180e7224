"""A sink format added from outside the package (here, a test) is one class and one registry line:
the pipelines file accepts its name, the plan task's sink checks and the arrow writer's rule ask it,
the batch job commits a real batch into it through ``run_batch`` (read by the session's broker and
local Spark), a replay adopts its commit, and a downstream task reads the batch back through it —
no existing module names it.

The toy format is a :class:`~airflow_kafka_backpressure.sinks.TableFormat`: one JSON file per batch,
replaced whole by a newer attempt, refusing an older one; it implements the DataFrame's commit and
its read-back, and gets the job's write and the replay's adoption with the base class."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from airflow_kafka_backpressure import sinks
from airflow_kafka_backpressure.batch.models import Adoption, JobSpec, OffsetRange
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.sink_placement import sink_refusal
from airflow_kafka_backpressure.operators.assets import batch_dataset
from airflow_kafka_backpressure.sinks import BatchCommit, SinkFenced, SinkFormatError, TableFormat
from airflow_kafka_backpressure.spark.job import run_batch
from kbp_local.producer import ensure_topic, produce

from .test_spark_job import make_spec


class ToySink(TableFormat):
    """Batch ``N`` of pipeline ``p`` is the file ``<sink>/p-N.json``: the attempt that wrote it, its
    ranges and its rows (partition, offset, value)."""

    name: ClassVar[str] = "toy"
    summary: ClassVar[str] = "one JSON file per batch"

    @staticmethod
    def path(sink: str, pipeline: str, batch_id: int) -> Path:
        return Path(sink) / f"{pipeline}-{int(batch_id)}.json"

    def write_batch(
        self,
        spark: Any,
        df: Any,
        sink: str,
        *,
        pipeline: str,
        batch_id: int,
        attempt: int,
        ranges: Sequence[OffsetRange],
        expected_records: int | None = None,
        details: Mapping[str, Any] | None = None,
        merge_schema: bool = False,
    ) -> BatchCommit:
        held = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
        if held is not None and held.attempt > attempt:
            raise SinkFenced(f"batch {batch_id}: attempt {held.attempt} committed it after attempt {attempt}")
        if held is not None and held.attempt == attempt:
            return held  # a retry of a committed attempt changes nothing
        rows = [[r["partition"], r["offset"], r["value"].decode()] for r in df.collect()]
        if expected_records is not None and len(rows) != expected_records:
            raise SinkFormatError(f"batch {batch_id}: {len(rows)} rows, the batch read {expected_records}")
        target = self.path(sink, pipeline, batch_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "pipeline": pipeline,
            "batch_id": batch_id,
            "attempt": attempt,
            "ranges": [r.to_dict() for r in ranges],
            "expected_records": expected_records,
            "details": dict(details or {}),
            "rows": rows,
        }
        target.with_suffix(".tmp").write_text(json.dumps(body))
        os.replace(target.with_suffix(".tmp"), target)  # the commit: the whole batch, or the old one
        commit = self.committed(spark, sink, pipeline=pipeline, batch_id=batch_id)
        assert commit is not None
        return commit

    def committed(self, spark: Any, sink: str, *, pipeline: str, batch_id: int) -> BatchCommit | None:
        target = self.path(sink, pipeline, batch_id)
        if not target.exists():
            return None
        d = json.loads(target.read_text())
        return BatchCommit(
            pipeline=d["pipeline"],
            batch_id=d["batch_id"],
            attempt=d["attempt"],
            ranges=tuple(OffsetRange.from_dict(r) for r in d["ranges"]),
            record_count=len(d["rows"]),
            expected_records=d["expected_records"],
            details=d["details"],
        )

    def batch_dataset(self, path: str, *, pipeline: str, batch_id: int) -> Any:
        # the signature from before commits named a read_at: still read (a format whose commits
        # name none is never given one)
        import pyarrow as pa
        import pyarrow.dataset as ds

        rows = json.loads(self.path(path, pipeline, batch_id).read_text())["rows"]
        return ds.dataset(pa.table({"partition": [r[0] for r in rows], "value": [r[2] for r in rows]}))


@pytest.fixture
def toy_registered():
    sinks.register(ToySink)
    try:
        yield
    finally:
        sinks.SINK_FORMATS.pop(ToySink.name)


def ids(values) -> list[int]:
    return sorted(json.loads(v)["id"] for v in values)


def test_a_registered_sink_format_is_accepted_and_asked_by_the_pipeline(tmp_path, toy_registered):
    toys = PipelineConfig(name="toys", topics=("t",), sink="s3a://lake/toys", sink_format="toy")  # accepted
    assert sink_refusal(toys, "local[2]") is None  # it renames no directory: an object store will do
    assert sinks.commit_lock_name("toy", toys.sink, {}) is None  # its commits need no lock
    with pytest.raises(ValueError, match="writer 'arrow' writes Parquet files itself; sink_format 'toy'"):
        PipelineConfig(
            name="toys",
            topics=("t",),
            sink=str(tmp_path),
            sink_format="toy",
            sink_options={"writer": "arrow"},
        )


def test_a_batch_lands_in_a_registered_sink_format_and_a_replay_adopts_it(
    spark, kafka_broker, topic_name, tmp_path, toy_registered
):
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    produce(kafka_broker.bootstrap, topic_name, count=30, partitions=2)  # id i at partition i % 2
    planned = {(topic_name, 0): (0, 5), (topic_name, 1): (10, 13)}
    sink = tmp_path / "sink"
    spec = make_spec(tmp_path, kafka_broker.bootstrap, 1, planned, sink=sink)
    spec = JobSpec.from_dict({**spec.to_dict(), "sink_format": "toy", "attempt": 1})

    metrics = run_batch(spark, spec)

    assert (metrics.records, metrics.adopted) == (8, False)
    assert {(p.partition, p.records) for p in metrics.partitions} == {(0, 5), (1, 3)}
    held = json.loads(ToySink.path(str(sink), "test", 1).read_text())
    assert held["attempt"] == 1 and held["details"]["records_read"] == 8
    assert ids(r[2] for r in held["rows"]) == [0, 2, 4, 6, 8, 21, 23, 25]

    # the worker died after the commit: the replay (attempt 2) adopts it without reading Kafka
    replay = JobSpec.from_dict(
        {**spec.to_dict(), "attempt": 2, "adopt": Adoption("a" * 32, spec.plan.ranges).to_dict()}
    )
    again = run_batch(spark, replay)
    assert (again.records, again.adopted) == (8, True)
    assert {(p.partition, p.records) for p in again.partitions} == {(0, 5), (1, 3)}
    assert json.loads(ToySink.path(str(sink), "test", 1).read_text())["attempt"] == 1  # untouched

    # a downstream task reads the batch its Asset event names, through the format
    output_path = sinks.sink_format_for("toy").event_path(str(sink), 1)
    event = {"batch_id": 1, "output_path": output_path, "sink_format": "toy"}
    assert ids(batch_dataset(event, "test").to_table().column("value").to_pylist()) == ids(
        r[2] for r in held["rows"]
    )


def test_an_unregistered_sink_format_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match="sink_format = 'toy' is invalid: one of parquet, delta"):
        PipelineConfig(name="toys", topics=("t",), sink=str(tmp_path / "p"), sink_format="toy")
