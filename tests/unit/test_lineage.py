"""OpenLineage facets of a batch, checked with the OpenLineage provider's own extractor and the
OpenLineage client's serializer (the provider is the optional ``openlineage`` extra)."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow.providers.openlineage", reason="the openlineage extra is not installed")

from airflow.providers.openlineage.extractors import OperatorLineage  # noqa: E402
from airflow.providers.openlineage.extractors.base import DefaultExtractor  # noqa: E402
from airflow.sdk import BaseOperator  # noqa: E402
from openlineage.client.serde import Serde  # noqa: E402

from airflow_kafka_backpressure.batch.models import OffsetRange  # noqa: E402
from airflow_kafka_backpressure.operators.lineage import batch_lineage, kafka_namespace, sink_dataset  # noqa: E402

RANGES = [OffsetRange("orders", 1, 40, 90), OffsetRange("orders", 0, 10, 60), OffsetRange("clicks", 0, 5, 5)]


def _lineage(sink="s3a://lake/raw/orders", replay=False):
    return batch_lineage(
        pipeline="orders",
        bootstrap_servers="SASL_SSL://b1.example:9093,b2.example:9093",
        sink=sink,
        batch_id=42,
        ranges=RANGES,
        records=100,
        replay=replay,
        output_path=f"{sink}/batch_id=42",
    )


class _Ingest(BaseOperator):
    """What the ingest/replay operators get: the method body calls batch_lineage."""

    def execute(self, context):
        return None

    def get_openlineage_facets_on_complete(self, task_instance):
        return _lineage(replay=True)


def test_naming_follows_openlineage_conventions(tmp_path):
    assert kafka_namespace("b1:9092,b2:9092") == "kafka://b1:9092"
    assert kafka_namespace("broker") == "kafka://broker:9092"
    assert sink_dataset("s3a://lake/raw/orders") == ("s3://lake", "raw/orders")
    assert sink_dataset("gs://bkt/x/y") == ("gs://bkt", "x/y")
    assert sink_dataset("hdfs://nn:8020/data/o") == ("hdfs://nn:8020", "/data/o")
    assert sink_dataset(str(tmp_path / "sink")) == ("file", str((tmp_path / "sink").resolve()))


def test_the_providers_extractor_accepts_the_facets_and_they_serialize_as_expected():
    lineage = DefaultExtractor(_Ingest(task_id="ingest")).extract_on_complete(None)
    assert isinstance(lineage, OperatorLineage)
    (topic,) = lineage.inputs  # the empty clicks range is no input
    data = Serde.to_dict(topic)
    assert data["namespace"] == "kafka://b1.example:9093" and data["name"] == "orders"
    facet = data["inputFacets"]["kafkaOffsetRanges"]
    assert facet["ranges"] == [
        {"partition": 0, "fromOffset": 10, "untilOffset": 60},
        {"partition": 1, "fromOffset": 40, "untilOffset": 90},
    ]
    assert facet["_producer"].startswith("https://") and facet["_schemaURL"].endswith(
        "KafkaOffsetRangesInputDatasetFacet"
    )
    (sink,) = lineage.outputs
    out = Serde.to_dict(sink)
    assert (out["namespace"], out["name"]) == ("s3://lake", "raw/orders")
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 100
    run = Serde.to_dict(lineage.run_facets["kafkaBackpressureBatch"])
    assert {k: run[k] for k in ("pipeline", "batchId", "replay", "records")} == {
        "pipeline": "orders",
        "batchId": 42,
        "replay": True,
        "records": 100,
    }
