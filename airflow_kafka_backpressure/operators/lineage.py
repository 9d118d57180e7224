"""OpenLineage facets of one batch, in the form ``get_openlineage_facets_on_complete`` returns.

Inputs: one dataset per Kafka topic, named as OpenLineage names Kafka datasets (namespace
``kafka://{first bootstrap host}:{port}``, name = the topic), with the batch's offset ranges in a
``kafkaOffsetRanges`` input facet (no standard facet describes offset ranges). Output: the sink
dataset (local path → namespace ``file``, ``s3``/``s3a``/``s3n`` → ``s3://{bucket}``, ``gs://``,
``hdfs://{host}:{port}``, ``abfss://{container}@{account}.dfs.core.windows.net``, any other URI →
``scheme://authority``), with ``outputStatistics`` (records written). A ``kafkaBackpressureBatch``
run facet carries the pipeline, batch id, replay flag and the batch's output path.

The OpenLineage provider is optional (extra ``openlineage``): everything is imported lazily, and
:func:`batch_lineage` returns None when the provider is not installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.operators.assets import sink_uri

PRODUCER = "https://github.com/airflow-provider-kafka-backpressure"
OFFSET_RANGES_FACET = "kafkaOffsetRanges"
BATCH_RUN_FACET = "kafkaBackpressureBatch"
DEFAULT_KAFKA_PORT = 9092


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server (OpenLineage's Kafka naming)."""
    first = bootstrap_servers.split(",")[0].strip()
    if "://" in first:  # e.g. SASL_SSL://host:9093
        first = first.split("://", 1)[1]
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        host, port = first, str(DEFAULT_KAFKA_PORT)
    return f"kafka://{host}:{port}"


def sink_dataset(sink: str) -> tuple[str, str]:
    """(namespace, name) of the sink under OpenLineage's naming conventions."""

    parts = urlsplit(sink_uri(sink))
    path = parts.path or "/"
    if parts.scheme == "file":
        return "file", path
    if parts.scheme in ("s3", "gs"):
        return f"{parts.scheme}://{parts.netloc}", path.lstrip("/") or "/"
    return f"{parts.scheme}://{parts.netloc}", path


def _facet_classes() -> tuple[type, type]:
    import attr
    from openlineage.client.generated.base import InputDatasetFacet, RunFacet

    @attr.define
    class KafkaOffsetRangesInputDatasetFacet(InputDatasetFacet):
        """The ``[fromOffset, untilOffset)`` ranges of the topic this batch read, per partition."""

        ranges: list[dict[str, int]] = attr.field(factory=list)

        @staticmethod
        def _get_schema() -> str:
            return f"{PRODUCER}/blob/main/docs/facets.json#/$defs/KafkaOffsetRangesInputDatasetFacet"

    @attr.define
    class KafkaBackpressureBatchRunFacet(RunFacet):
        """The micro-batch this task run committed."""

        pipeline: str = attr.field(default="")
        batchId: int = attr.field(default=0)  # noqa: N815
        replay: bool = attr.field(default=False)
        records: int = attr.field(default=0)
        outputPath: str = attr.field(default="")  # noqa: N815

        @staticmethod
        def _get_schema() -> str:
            return f"{PRODUCER}/blob/main/docs/facets.json#/$defs/KafkaBackpressureBatchRunFacet"

    return KafkaOffsetRangesInputDatasetFacet, KafkaBackpressureBatchRunFacet


def batch_lineage(
    *,
    pipeline: str,
    bootstrap_servers: str,
    sink: str,
    batch_id: int,
    ranges: Iterable[OffsetRange],
    records: int,
    replay: bool,
    output_path: str,
) -> Any:
    """An ``OperatorLineage`` for the batch, or None without the OpenLineage provider."""
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset
    except ImportError:
        return None
    ranges_facet, batch_facet = _facet_classes()
    by_topic: dict[str, list[OffsetRange]] = {}
    for r in sorted(ranges):
        if r.count:
            by_topic.setdefault(r.topic, []).append(r)
    namespace = kafka_namespace(bootstrap_servers)
    inputs = [
        InputDataset(
            namespace=namespace,
            name=topic,
            inputFacets={
                OFFSET_RANGES_FACET: ranges_facet(
                    ranges=[
                        {"partition": r.partition, "fromOffset": r.from_offset, "untilOffset": r.until_offset}
                        for r in rs
                    ],
                    producer=PRODUCER,
                )
            },
        )
        for topic, rs in by_topic.items()
    ]
    out_namespace, out_name = sink_dataset(sink)
    outputs = [
        OutputDataset(
            namespace=out_namespace,
            name=out_name,
            outputFacets={
                "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=int(records), producer=PRODUCER
                )
            },
        )
    ]
    run_facets = {
        BATCH_RUN_FACET: batch_facet(
            pipeline=pipeline,
            batchId=int(batch_id),
            replay=bool(replay),
            records=int(records),
            outputPath=output_path,
            producer=PRODUCER,
        )
    }
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run_facets)
