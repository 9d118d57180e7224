"""The arrow writer's pure parts: Spark's codec names, the sink's dictionary rule, file names."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.models import OffsetRange
from airflow_kafka_backpressure.spark.arrow_writer import RangeFileTask, dictionary_columns, parquet_codec
from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA


def test_spark_codec_names_map_to_pyarrows_and_an_unknown_one_says_what_to_do():
    assert parquet_codec(None) == "SNAPPY"
    assert parquet_codec("ZSTD") == "ZSTD" and parquet_codec("none") == "NONE" == parquet_codec("uncompressed")
    with pytest.raises(ValueError, match="'lzo' is not available with writer 'arrow'.*writer 'spark'"):
        parquet_codec("lzo")


def test_the_plain_columns_are_the_sinks_and_a_comma_separated_list_works():
    names = KAFKA_ARROW_SCHEMA.names
    assert dictionary_columns(names, None) == ["topic", "partition", "timestamp", "timestampType", "headers"]
    assert dictionary_columns(names, "value, headers") == ["key", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert dictionary_columns(names, ()) == names


def test_each_piece_has_its_own_file_name_per_attempt():
    pieces = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 9)]
    task = RangeFileTask(pieces, {}, {}, "/s", "/s/_read", "tok1", "zstd", None)
    assert task.file_name(0) == "part-00000-tok1.zstd.parquet" != task.file_name(1)
