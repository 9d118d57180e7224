"""Records/s into each sink format and location, and a commit's cost as the sink's history grows, in one run.

Two measurements, each through the product's own write path (the fence, the commit and its
read-back included), in one local Spark session (``--master``, default local[2]) with Delta's jars
and Hadoop's S3A filesystem, against the local disk and a real S3-compatible server (SeaweedFS's S3
gateway on 127.0.0.1, :class:`~airflow_kafka_backpressure.local.s3.S3Server`):

* **throughput**: one batch of ``--records`` (default 1,000,000) rows shaped as Kafka records
  (key, a ``--payload-bytes`` value, topic, partition, offset, timestamp), generated and cached in
  Spark first, so the figure is the sink's cost alone (no Kafka read), written ``--repeat`` times
  (a new attempt of the same batch each time; the best and the median are printed) as records/s:

  - ``parquet local``: the Parquet-directory sink (``spark.sink.write_batch``: staging directory,
    fence, commit with the row check, swap), Spark's Parquet writer;
  - ``delta local`` and ``delta s3``: the Delta sink (``sinks.DeltaSink.write_batch``: one
    transaction with ``replaceWhere`` and the batch's ``txnAppId``/``txnVersion``, then the
    commit read back from the table's history);
  - ``parquet s3`` is refused by the pipeline (``pipeline.sink_refusal``): its message is printed.

* **commit cost against history**: small batches (``--small-records`` rows each) are committed one
  after the other into a fresh sink of each format (``--history-locations``, default local); when
  the sink holds each checkpoint's number of batches (``--history``, default 10,100), ``--samples``
  more commits are timed and their median printed, then the ratio of the last checkpoint's to the
  first's. A commit whose cost does not grow with the sink's history gives a ratio near 1. The
  issue's 10 vs 10,000 batches: ``--history 10,10000`` (about half a day on a 2-core machine: a
  Delta commit of a small batch takes seconds there; ``--conf`` passes Spark settings to compare).

    .venv/bin/python bench/sinks.py                                  # 1M records; history 10 → 100
    .venv/bin/python bench/sinks.py --history 10,10000 --skip-throughput
    .venv/bin/python bench/sinks.py --records 100000 --repeat 1 --history 10,50   # a quick look
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.models import OffsetRange
from airflow_kafka_backpressure.pipeline import PipelineConfig, sink_refusal
from airflow_kafka_backpressure.sinks import DeltaSink
from airflow_kafka_backpressure.spark import sink as parquet_sink

REPO = Path(__file__).resolve().parents[1]
PIPELINE, TOPIC, PARTITIONS = "bench", "bench-events", 4
BUCKET = "kbp-bench"


def session(master: str, work: Path, s3: Any, extra: dict[str, str]) -> Any:
    """A SparkSession with Delta's jars and SQL extension and S3A (both on the JVM's class path),
    and the ``extra`` settings of ``--conf``."""
    from pyspark.sql import SparkSession

    from airflow_kafka_backpressure.local.jars import combined_spark_conf, spark_delta_conf, spark_s3a_conf

    builder = SparkSession.builder.master(master).appName("kbp-bench-sinks")
    conf = {
        **combined_spark_conf(
            spark_delta_conf(jars="extraClassPath"), spark_s3a_conf(s3, jars="extraClassPath")
        ),
        "spark.driver.memory": "2g",
        "spark.local.dir": str(work / "spark-local"),
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.warehouse.dir": str(work / "warehouse"),
    }
    for key, value in {**conf, **extra}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def kafka_rows(
    spark: Any, n: int, payload_bytes: int, first_offset: int = 0
) -> tuple[Any, list[OffsetRange]]:
    """``n`` rows shaped as the Kafka source's, over :data:`PARTITIONS` partitions, and their ranges."""
    per = -(-n // PARTITIONS)
    hex_chars = max(2, 2 * payload_bytes)
    df = spark.range(0, n, numPartitions=PARTITIONS).selectExpr(
        "cast(cast(id as string) as binary) as key",
        f"unhex(rpad(sha2(cast(id as string), 256), {hex_chars}, 'a1')) as value",
        f"'{TOPIC}' as topic",
        f"cast(id div {per} as int) as partition",
        f"id % {per} + {first_offset} as offset",
        "timestamp_millis(1700000000000 + id) as timestamp",
        "0 as timestampType",
    )
    counts = [min(per, n - p * per) for p in range(PARTITIONS)]
    ranges = [OffsetRange(TOPIC, p, first_offset, first_offset + c) for p, c in enumerate(counts) if c > 0]
    return df, ranges


def writer(fmt: str, spark: Any, sink: str) -> Callable[[Any, int, int, list[OffsetRange], int], None]:
    """A function committing (df, batch id, attempt, ranges, rows) through the format's write path."""
    if fmt == "parquet":

        def write_parquet(df: Any, batch_id: int, attempt: int, ranges: list[OffsetRange], rows: int) -> None:
            manifest = parquet_sink.write_batch(
                spark, df, sink, batch_id, ranges, {"pipeline": PIPELINE}, attempt=attempt
            )
            assert manifest["rows"] == rows, manifest["rows"]

        return write_parquet
    delta = DeltaSink()

    def write_delta(df: Any, batch_id: int, attempt: int, ranges: list[OffsetRange], rows: int) -> None:
        commit = delta.write_batch(
            spark,
            df,
            sink,
            pipeline=PIPELINE,
            batch_id=batch_id,
            attempt=attempt,
            ranges=ranges,
            expected_records=rows,
        )
        assert commit.record_count == rows, commit

    return write_delta


def locations(work: Path) -> dict[str, Callable[[str], str]]:
    return {
        "local": lambda name: str(work / "sinks" / name),
        "s3": lambda name: f"s3a://{BUCKET}/{name}",
    }


def throughput(spark: Any, args: argparse.Namespace, where: dict[str, Callable[[str], str]]) -> None:
    df, ranges = kafka_rows(spark, args.records, args.payload_bytes)
    df = df.cache()
    rows = df.count()
    print(
        f"\nthroughput: one batch of {rows:,} records ({args.payload_bytes}-byte values), {args.repeat} runs each"
    )
    refusal = sink_refusal(PipelineConfig(name=PIPELINE, topics=(TOPIC,), sink=where["s3"]("parquet")), None)
    print(f"  {'parquet s3':<14} refused by the pipeline: {refusal}")
    for fmt, loc in (("parquet", "local"), ("delta", "local"), ("delta", "s3")):
        write = writer(fmt, spark, where[loc](f"throughput-{fmt}"))
        times = []
        for attempt in range(1, args.repeat + 1):
            t0 = time.perf_counter()
            write(df, 1, attempt, ranges, rows)
            times.append(time.perf_counter() - t0)
        best, median = min(times), statistics.median(times)
        print(
            f"  {fmt + ' ' + loc:<14} best {rows / best:>10,.0f} records/s ({best:.2f} s), "
            f"median {rows / median:>10,.0f} records/s ({median:.2f} s)"
        )
    df.unpersist()


def history(spark: Any, args: argparse.Namespace, where: dict[str, Callable[[str], str]]) -> None:
    checkpoints = sorted({int(x) for x in args.history.split(",")})
    print(
        f"\ncommit cost against history: batches of {args.small_records} rows; median of {args.samples} "
        f"commits at {', '.join(map(str, checkpoints))} batches in the sink"
    )
    for loc in args.history_locations.split(","):
        for fmt in ("parquet", "delta"):
            if fmt == "parquet" and loc == "s3":
                continue  # refused by the pipeline (see the throughput part)
            medians, line = commit_times(
                spark, args, writer(fmt, spark, where[loc](f"history-{fmt}")), checkpoints
            )
            ratio = medians[-1] / medians[0]
            print(f"  {fmt + ' ' + loc:<14} " + ", ".join(line) + f"; last/first {ratio:.2f}x")


def commit_times(
    spark: Any, args: argparse.Namespace, write: Callable[..., None], checkpoints: list[int]
) -> tuple[list[float], list[str]]:
    """Commit small batches one after the other; at each checkpoint the median of ``--samples``
    more commits (seconds), and the checkpoints' descriptions."""
    medians: list[float] = []
    line: list[str] = []
    batch_id = 0

    def one() -> float:
        nonlocal batch_id
        df, ranges = kafka_rows(spark, args.small_records, 16, first_offset=batch_id * args.small_records)
        t0 = time.perf_counter()
        write(df, batch_id, 1, ranges, args.small_records)
        batch_id += 1
        return time.perf_counter() - t0

    for checkpoint in checkpoints:
        while batch_id < checkpoint:
            one()
        medians.append(statistics.median(one() for _ in range(args.samples)))
        line.append(f"{checkpoint}: {medians[-1] * 1000:.0f} ms")
    return medians, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--history", default="10,100", help="batches in the sink at which commits are timed")
    ap.add_argument("--history-locations", default="local", help="comma-separated: local, s3")
    ap.add_argument("--small-records", type=int, default=100)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-history", action="store_true")
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, e.g. spark.databricks.delta.snapshotPartitions=2",
    )
    args = ap.parse_args()

    from airflow_kafka_backpressure.local.s3 import S3Server

    (REPO / ".tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-sinks-", dir=REPO / ".tmp"))
    s3 = S3Server(work / "s3")
    spark = None
    try:
        s3.start()
        s3.create_bucket(BUCKET)
        spark = session(args.master, work, s3, dict(kv.split("=", 1) for kv in args.conf))
        spark.sparkContext.setLogLevel("WARN")
        print(f"spark {spark.version}, master {args.master}, {os.cpu_count()} cores; S3 server {s3.endpoint}")
        if args.conf:
            print(f"settings: {', '.join(args.conf)}")
        where = locations(work)
        if not args.skip_throughput:
            throughput(spark, args, where)
        if not args.skip_history:
            history(spark, args, where)
    finally:
        if spark is not None:
            spark.stop()
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
