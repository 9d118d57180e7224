"""A pipeline's decoding as configured and carried (pure): the fields of the pipelines file, the
bad-record bound, the prepared value the job spec carries, and the metrics that report it."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import BatchMetrics, BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.decoders import DecoderError, decoder_for
from airflow_kafka_backpressure.decoders.decoding import (
    Decoding,
    bad_records_allowed,
    bound_problem,
    bound_text,
    prepare_decoding,
)


def pipeline(**kw) -> PipelineConfig:
    return PipelineConfig(name="orders", topics=["orders"], sink="/lake/orders", **kw)


@pytest.mark.parametrize(
    "bound, records, allowed",
    [(None, 100, None), (0, 100, 0), (5, 10, 5), (0.01, 1000, 10), (0.01, 99, 0), (0.5, 7, 3)],
)
def test_the_bound_is_a_count_or_a_share_of_the_batch(bound, records, allowed):
    assert bound_problem(bound) is None
    assert bad_records_allowed(bound, records) == allowed


@pytest.mark.parametrize("bound", [-1, 1.0, 0.0, 1.5, float("nan"), True, "5"])
def test_a_bound_that_is_neither_is_refused_with_the_rule(bound):
    assert "an integer >= 0" in (bound_problem(bound) or "")
    with pytest.raises(ValueError, match="max_bad_records"):
        pipeline(max_bad_records=bound)


def test_bound_text_names_a_share_as_a_percentage():
    assert bound_text(0.01) == "max_bad_records = 0.01 (1% of the batch)"
    assert bound_text(3) == "max_bad_records = 3"


def test_raw_fields_decode_nothing_and_the_job_gets_no_decoding():
    p = pipeline()
    assert p.decoders() == {}
    assert prepare_decoding(p.decoders(), p.topics, None) is None


def test_a_format_reading_the_registry_needs_its_connection():
    with pytest.raises(ValueError, match="schema_registry_conn_id.*value_format 'avro' reads schemas"):
        pipeline(value_format="avro")
    with pytest.raises(ValueError, match="key_format 'avro' and value_format 'json' read schemas"):
        pipeline(key_format="avro", value_format="json")
    # a declared JSON schema needs none
    assert set(pipeline(value_format="json", value_options={"schema": "id BIGINT"}).decoders()) == {"value"}


def test_unknown_formats_and_options_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"value_format = 'protobuf' is invalid.*docs/limitations.md"):
        pipeline(value_format="protobuf")
    with pytest.raises(ValueError, match=r"the value's avro format: unknown option\(s\) 'versio'"):
        pipeline(value_format="avro", schema_registry_conn_id="sr", value_options={"versio": 2})
    with pytest.raises(ValueError, match="version must be 'latest' or a number"):
        pipeline(key_format="avro", schema_registry_conn_id="sr", key_options={"version": 0})


def test_the_arrow_writer_refuses_a_decoded_pipeline():
    with pytest.raises(ValueError, match="writer 'arrow' writes the raw records.*this pipeline decodes"):
        pipeline(
            value_format="json",
            value_options={"schema": "id BIGINT"},
            reader="python",
            sink_options={"writer": "arrow"},
        )


def test_the_job_spec_carries_schema_text_and_the_bound_and_metrics_carry_bad_records():
    decoding = prepare_decoding(
        {"value": decoder_for("json", "value", {"schema": "id BIGINT"})},
        ["orders"],
        None,
        max_bad_records=0.05,
        keep_raw_value=True,
    )
    assert decoding is not None
    plan = BatchPlan("orders", 3, "run", (OffsetRange("orders", 0, 0, 10),), "/lake/orders", 1000, 0)
    spec = JobSpec(plan=plan, kafka={}, launched_at_ms=0, decoding=decoding.to_dict())
    again = JobSpec.from_dict(spec.to_dict())
    assert Decoding.from_dict(again.decoding or {}) == decoding
    assert again.decoding == {
        "specs": {
            "value": {
                "name": "json",
                "field": "value",
                "options": {"schema": "id BIGINT"},
                "resolved": {"header": False, "known_ids": None, "ddl": "id BIGINT"},
            }
        },
        "max_bad_records": 0.05,
        "keep_raw_value": True,
    }
    metrics = BatchMetrics(3, 10, 100, 0, 0, 1, 1, bad_records=2)
    assert BatchMetrics.from_dict(metrics.to_dict()).bad_records == 2
    assert BatchMetrics.from_dict({**metrics.to_dict(), "bad_records": None}).bad_records == 0


def test_a_spec_given_for_the_wrong_field_is_refused():
    spec = decoder_for("raw", "key").prepare(["t"], None)
    with pytest.raises(DecoderError, match="given for 'value'"):
        Decoding({"value": spec})
