"""spark-submit application of test_s3_server: Spark's own Parquet writer to ``s3a://`` and back.

    s3a_roundtrip_app.py s3a://bucket/path ROWS

Writes ROWS rows (``id``, ``name``) as Parquet in 3 files, reads the directory back and prints one
JSON line: the rows read, their id sum and distinct ids, and the Parquet files Hadoop lists there.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(path: str, rows: int) -> None:
    spark = SparkSession.builder.appName("kbp-s3a-roundtrip").getOrCreate()
    try:
        df = spark.range(rows).select(
            F.col("id"), F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name")
        )
        df.repartition(3).write.mode("errorifexists").parquet(path)
        back = spark.read.parquet(path)
        stats = back.agg(
            F.count("*").alias("n"), F.sum("id").alias("id_sum"), F.countDistinct("id").alias("ids")
        ).first()
        jvm = spark.sparkContext._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        files = sorted(s.getPath().getName() for s in fs.listStatus(hpath))
        print(
            json.dumps(
                {
                    "rows": stats["n"],
                    "id_sum": stats["id_sum"],
                    "distinct_ids": stats["ids"],
                    "files": files,
                    "fs": fs.getClass().getName(),
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
