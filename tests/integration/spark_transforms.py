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


def first_evaluation_only(df: DataFrame) -> DataFrame:
    """Keeps each record the first time its row is evaluated and drops it on any later evaluation: a
    transform whose output differs each time it runs (as a non-deterministic one does), with a side
    effect per row (a marker file per record in the folder ``KBP_TEST_MARKS`` names, read here, on
    the driver). Computed once, it keeps every record."""
    import os

    marks = os.environ["KBP_TEST_MARKS"]

    @F.udf("boolean")
    def first_time(topic, partition, offset):  # no type hints: pyspark would read them as a pandas UDF's
        try:
            os.close(os.open(os.path.join(marks, f"{topic}-{partition}-{offset}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    return df.where(first_time("topic", "partition", "offset")).drop("headers")
