"""User transforms for the Spark job tests, referenced as ``tests.integration.spark_transforms:<name>``."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def even_ids(df: DataFrame) -> DataFrame:
    """Parse ``id`` out of the JSON value, keep even ids, drop the headers."""
    parsed = df.withColumn("id", F.get_json_object(F.col("value").cast("string"), "$.id").cast("long"))
    return parsed.where(F.col("id") % 2 == 0).drop("headers")


def not_a_dataframe(df: DataFrame) -> int:
    return 42


def unrelated(df: DataFrame) -> DataFrame:
    """Ignores its input: the job must still count what the batch read."""
    return df.sparkSession.range(3)


NOT_CALLABLE = "just a string"
