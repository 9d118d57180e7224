"""The arrow writer's pure parts: Spark's codec names, the sink's dictionary rule, file names."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.spark.arrow_writer import RangeFileTask, dictionary_columns, parquet_codec
from airflow_kafka_backpressure.spark.kafka_arrow import KAFKA_ARROW_SCHEMA


def test_spark_codec_names_map_to_pyarrows_and_an_unknown_one_says_what_to_do():
    assert parquet_codec(None) == "SNAPPY"
    assert parquet_codec("ZSTD") == "ZSTD" and parquet_codec("none") == "NONE" == parquet_codec(
        "uncompressed"
    )
    with pytest.raises(ValueError, match="'lzo' is not available with writer 'arrow'.*writer 'spark'"):
        parquet_codec("lzo")


def test_the_plain_columns_are_the_sinks_and_a_comma_separated_list_works():
    names = KAFKA_ARROW_SCHEMA.names
    assert dictionary_columns(names, None) == ["topic", "partition", "timestamp", "timestampType", "headers"]
    assert dictionary_columns(names, "value, headers") == [
        "key",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert dictionary_columns(names, ()) == names


def test_each_piece_has_its_own_file_name_per_attempt():
    pieces = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 9)]
    task = RangeFileTask(pieces, {}, {}, "/s", "/s/_read", "tok1", "zstd", None)
    assert task.file_name(0) == "part-00000-tok1.zstd.parquet" != task.file_name(1)


def test_auto_picks_the_arrow_writer_only_for_the_python_readers_raw_records_in_a_codec_it_writes():
    from airflow_kafka_backpressure.batch.models import DEFAULT_WRITER, chosen_writer, writer_problem
    from airflow_kafka_backpressure.spark.job import arrow_codec
    from airflow_kafka_backpressure.spark.readers import READERS, feeds_arrow_writer

    python, native = READERS["python"].feeds_arrow_writer, READERS["native"].feeds_arrow_writer
    assert python and not native and feeds_arrow_writer("auto") and not feeds_arrow_writer("native")
    assert DEFAULT_WRITER == "auto" and writer_problem("auto", "m:f", "native", native) is None
    assert "reader 'auto' or 'python'" in (writer_problem("arrow", None, "native", native) or "")
    assert chosen_writer("auto", None, python) == "arrow"
    assert chosen_writer("auto", "m:f", python) == "spark"  # a transform needs Spark's rows
    assert chosen_writer("auto", None, native) == "spark"  # Spark's Kafka source reads in the JVM
    assert chosen_writer("auto", None, python, arrow_codec("lzo")) == "spark"
    assert arrow_codec(None) and arrow_codec("zstd") and not arrow_codec("lzo")
    # an explicit choice stands
    assert chosen_writer("spark", None, python) == "spark" and chosen_writer("arrow", None, python) == "arrow"


def test_a_task_writes_every_piece_of_its_group_and_reports_each():
    import pyarrow as pa

    pieces = [OffsetRange("t", p, 0, 5) for p in range(3)]
    task = RangeFileTask(pieces, {}, {}, "/s", "/s/_read", "tok1", None, None, groups=[[0, 2], [1]])
    written: list[int] = []
    task.write_piece = lambda index: (
        written.append(index) or 5
    )  # the reading and writing are the integration tests'
    out = list(task(iter([pa.record_batch({"id": pa.array([0], pa.int64())})])))
    assert written == [0, 2]
    assert [b.to_pydict() for b in out] == [{"piece": [0], "rows": [5]}, {"piece": [2], "rows": [5]}]
    assert RangeFileTask(pieces, {}, {}, "/s", "/s/_read", "tok1", None, None).groups == [[0], [1], [2]]
