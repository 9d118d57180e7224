"""The Parquet files of an Iceberg batch (:mod:`.iceberg`): Spark writes them, pyiceberg's file IO
reads their footers (the batch's columns and its row count) before the sink commits them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def write_files(spark: Any, rows: Any, folder: str, split_by: str | None = None) -> list[str]:
    """Write ``rows`` as Parquet into ``folder`` (Iceberg's microsecond timestamps), one folder per
    value of ``split_by`` (a column left out of the files), and return the data files Spark wrote."""
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        writer = rows.write.mode("error")  # a folder of its own (Connect takes no "errorifexists")
        if split_by is not None:
            writer = writer.partitionBy(split_by)
        writer.parquet(folder)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    return sorted(spark.read.parquet(folder).inputFiles())


def file_schema(io: Any, path: str) -> Any:
    """The Arrow schema of the Parquet file at ``path`` (its footer, through pyiceberg's file IO)."""
    import pyarrow.parquet as pq

    with io.new_input(path).open() as f:
        return pq.read_schema(f)


def rows_in(io: Any, files: Sequence[str]) -> int:
    """The rows the Parquet ``files`` hold, from their footers."""
    import pyarrow.parquet as pq

    total = 0
    for path in files:
        with io.new_input(path).open() as f:
            total += pq.read_metadata(f).num_rows
    return total
