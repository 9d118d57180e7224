"""Reading a committed batch's manifest back (the sink's ``_manifest.json``, see :mod:`.commit`).

``spark.read.format("kbp_batch_manifest")`` reads it in a Spark task — where the sink is visible,
which a Spark Connect client may not be. With ``verify=true`` the task also checks every file the
manifest lists (present, at its listed size) and reports what is wrong under ``file_problems``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from airflow_kafka_backpressure.batch.models import batch_path
from airflow_kafka_backpressure.sinks.parquet.fencing import file_problems
from airflow_kafka_backpressure.storage import Location, location

MANIFEST_SOURCE_NAME = "kbp_batch_manifest"
MANIFEST_NAME = "_manifest.json"
MANIFEST_SCHEMA = StructType([StructField("manifest", StringType())])


def manifest_at(batch_dir: Location) -> dict[str, Any] | None:
    """The manifest in the batch directory ``batch_dir``, or None when it holds none."""
    p = batch_dir.child(MANIFEST_NAME)
    if not p.exists():
        return None
    return json.loads(p.read_bytes())


def read_manifest(sink: str, batch_id: int, *, verify: bool = False) -> dict[str, Any] | None:
    """The committed manifest of batch ``batch_id``, or None when the batch is not in the sink.
    ``verify``: add ``file_problems`` (listed files missing or of another size; empty: complete)."""
    batch_dir = location(sink).child(batch_path("", batch_id).lstrip("/"))
    manifest = manifest_at(batch_dir)
    if manifest is not None and verify:
        manifest["file_problems"] = file_problems(batch_dir, manifest)
    return manifest


def committed_manifest(
    spark: Any, sink: str, batch_id: int, *, verify: bool = False
) -> dict[str, Any] | None:
    """The committed manifest of a batch, read by a Spark task (Connect clients may not see the sink)."""
    rows = (
        spark.read.format(MANIFEST_SOURCE_NAME)
        .options(sink=sink, batchId=str(int(batch_id)), verify=str(bool(verify)).lower())
        .load()
        .collect()
    )
    text = rows[0][0] if rows else None
    return None if text is None else json.loads(text)


class _ManifestReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        opts = {str(k).lower(): v for k, v in options.items()}
        self.sink = opts["sink"]
        self.batch_id = int(opts["batchid"])
        self.verify = str(opts.get("verify", "false")).lower() == "true"

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str | None]]:
        manifest = read_manifest(self.sink, self.batch_id, verify=self.verify)
        yield (None if manifest is None else json.dumps(manifest),)


class BatchManifestDataSource(DataSource):
    """``spark.read.format("kbp_batch_manifest")``: a committed batch's manifest, read where Spark
    runs — the Connect client may not see the sink's filesystem."""

    @classmethod
    def name(cls) -> str:
        return MANIFEST_SOURCE_NAME

    def schema(self) -> StructType:
        return MANIFEST_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ManifestReader(dict(self.options))
