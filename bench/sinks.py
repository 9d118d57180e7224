"""Records/s into each sink format and location, and a commit's cost as the sink's history grows, in one run.

Two measurements, each through the product's own write path (the fence, the commit and its
read-back included), in one local Spark session (``--master``, default local[2]) with Delta's jars
and Hadoop's S3A filesystem, against the local disk and a real S3-compatible server (SeaweedFS's S3
gateway on 127.0.0.1, :class:`~kbp_local.s3.S3Server`):

* **throughput**: one batch of ``--records`` (default 1,000,000) rows shaped as Kafka records
  (key, a ``--payload-bytes`` value, topic, partition, offset, timestamp), generated and cached in
  Spark first, so the figure is the sink's cost alone (no Kafka read), written ``--repeat`` times
  (each time as a new batch's first attempt, a scheduled run's path; the best and the median are
  printed) as records/s:

  - ``parquet local``: the Parquet-directory sink (``sinks.parquet.write.write_batch``: staging directory,
    fence, commit with the row check, swap), Spark's Parquet writer;
  - ``delta local`` and ``delta s3``: the Delta sink (``sinks.DeltaSink.write_batch``: one
    transaction, an append since each run is a first attempt, with the batch's
    ``txnAppId``/``txnVersion``, then the commit read back from the table's history);
  - ``iceberg local`` and ``iceberg s3``: the Iceberg sink (``sinks.IcebergSink.write_batch``: Spark
    writes the files, pyiceberg commits them through its SQL catalog on SQLite);
  - ``parquet s3`` is refused by the pipeline (``sink_placement.sink_refusal``): its message is printed.

* **commit cost against history**: small batches (``--small-records`` rows each) are committed one
  after the other into a fresh sink of each format (``--history-locations``, default local); when
  the sink holds each checkpoint's number of batches (``--history``, default 10,100), ``--samples``
  more commits are timed and their median printed, then the ratio of the last checkpoint's to the
  first's. A commit whose cost does not grow with the sink's history gives a ratio near 1. Beside
  each median, the median of ``--samples`` replays of each kind, and at the end their ratios too:
  a replay of a committed batch (one of the newest batches committed again as its second attempt:
  a replay of a batch whose worker died after the commit, or a cleared run's rewrite) and a replay
  of a batch that never committed (the usual replay: a failed batch's second attempt, whose batch
  id the sink has never seen).
  ``--prefill`` (local sinks) fills the history between checkpoints without Spark, so 10,000
  batches take minutes instead of half a day (a Delta commit of a small batch takes seconds on a
  2-core machine): the first batch is committed through the product's path (it creates the
  table), every later one up to the checkpoint is a copy of it with its own batch id, offsets and
  metadata (``bench/sinks_prefill.py``) — for the Parquet directory a ``batch_id=<N>`` folder with its manifest, for Delta one
  table version per batch with what the product's commit holds (its data files, its ``add``
  actions with their statistics, its ``txnAppId``/``txnVersion`` and ``userMetadata``), written
  into the log directly, then a checkpoint (delta-rs) as Spark keeps one (:func:`prefill_delta`).
  One untimed product commit follows each prefill (Spark reads the new log), then the timed ones. ``--conf`` passes Spark settings to compare.

* **compaction** (``--compaction``): after a table format's history, a reader's two queries (a scan
  of every row, one batch's rows; without Spark: delta-rs and pyiceberg) timed before and after
  one run of the table's maintenance (``SinkFormat.maintain``), and the maintenance's own time.

    PYTHONPATH=. .venv/bin/python bench/sinks.py                                  # 1M records; history 10 → 100
    PYTHONPATH=. .venv/bin/python bench/sinks.py --history 10,10000 --prefill --skip-throughput
    PYTHONPATH=. .venv/bin/python bench/sinks.py --skip-throughput --history 10,200 --history-formats delta,iceberg --compaction
    PYTHONPATH=. .venv/bin/python bench/sinks.py --records 100000 --repeat 1 --history 10,50   # a quick look
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.sink_placement import sink_refusal
from airflow_kafka_backpressure.sinks import TableFormat, sink_format_for
from airflow_kafka_backpressure.sinks.parquet import write as parquet_sink

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sinks_prefill import PARTITIONS, PIPELINE, TOPIC, prefill_delta, prefill_iceberg, prefill_parquet  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BUCKET = "kbp-bench"
#: the Iceberg sink's SQL catalog (SQLite in the run's work folder), set by main()
ICEBERG_CATALOG: list[str] = []


def session(master: str, work: Path, s3: Any, extra: dict[str, str]) -> Any:
    """A SparkSession with Delta's jars and SQL extension and S3A (both on the JVM's class path),
    and the ``extra`` settings of ``--conf``."""
    from pyspark.sql import SparkSession

    from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_s3a_conf

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
    # a table format, from the registry with the sink options it takes (the Iceberg catalog)
    table = sink_format_for(fmt, {"iceberg_catalog_uri": ICEBERG_CATALOG[0]})
    assert isinstance(table, TableFormat), fmt

    def write_table(df: Any, batch_id: int, attempt: int, ranges: list[OffsetRange], rows: int) -> None:
        commit = table.write_batch(
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

    return write_table


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
    for fmt, loc in (
        ("parquet", "local"),
        ("delta", "local"),
        ("delta", "s3"),
        ("iceberg", "local"),
        ("iceberg", "s3"),
    ):
        write = writer(fmt, spark, where[loc](f"throughput-{fmt}-{loc}"))
        times = []
        for batch_id in range(1, args.repeat + 1):
            t0 = time.perf_counter()
            write(df, batch_id, 1, ranges, rows)
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
        for fmt in args.history_formats.split(","):
            if fmt == "parquet" and loc == "s3":
                continue  # refused by the pipeline (see the throughput part)
            sink = where[loc](f"history-{fmt}-{loc}")
            fill = prefills(args).get(fmt) if args.prefill and loc == "local" else None
            medians, line = commit_times(spark, args, writer(fmt, spark, sink), checkpoints, sink, fill)
            commit, committed, fresh = (medians[-1][k] / medians[0][k] for k in range(3))
            how = ", history prefilled" if fill else ""
            print(
                f"  {fmt + ' ' + loc:<14} "
                + "; ".join(line)
                + f"; last/first: commit {commit:.2f}x, replays {committed:.2f}x and {fresh:.2f}x{how}"
            )
            if args.compaction and fmt != "parquet":
                compaction(args, fmt, sink, checkpoints[-1])


def queries(fmt: Any, sink: str, batch_id: int) -> tuple[float, float]:
    """The medians of 3 runs of two queries a reader of the table runs, in seconds, without Spark
    (Iceberg's Spark runtime does not exist for Spark 4.2): a scan of every row's ``offset``
    (``table_dataset``, summed), and one batch's rows (``batch_dataset``: the table filtered to the batch, its files
    pruned by their statistics)."""
    import pyarrow.compute as pc

    def scan() -> None:
        table = fmt.table_dataset(sink, columns=["offset"]).to_table(columns=["offset"])
        pc.sum(table.column("offset"))

    def one_batch() -> None:
        assert fmt.batch_dataset(sink, pipeline=PIPELINE, batch_id=batch_id).count_rows() > 0

    def median(query: Callable[[], None]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            query()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return median(scan), median(one_batch)


def compaction(args: argparse.Namespace, name: str, sink: str, batches: int) -> None:
    """A reader's queries on the table of ``batches`` small batches before and after one run of the
    table's maintenance (the product's ``SinkFormat.maintain``: compaction into 128 MB files and
    the default retention of 168 h, so nothing is expired or vacuumed yet), and the maintenance's
    own time."""
    from airflow_kafka_backpressure.batch.options import MaintenanceOptions

    fmt = sink_format_for(name, {"iceberg_catalog_uri": ICEBERG_CATALOG[0]})
    middle = batches // 2
    before = queries(fmt, sink, middle)
    t0 = time.perf_counter()
    report = fmt.maintain(sink, MaintenanceOptions())
    took = time.perf_counter() - t0
    after = queries(fmt, sink, middle)
    files = (sum(p.files for p in report.before.values()), sum(p.files for p in report.after.values()))
    print(
        f"    compaction at {batches:,} batches: {files[0]:,} -> {files[1]:,} data files in {took:.1f} s; "
        f"a scan of every row {before[0] * 1000:.0f} -> {after[0] * 1000:.0f} ms "
        f"({after[0] / before[0]:.2f}x), one batch's rows {before[1] * 1000:.0f} -> {after[1] * 1000:.0f} ms "
        f"({after[1] / before[1]:.2f}x)"
    )


def prefills(args: argparse.Namespace) -> dict[str, Callable[[str, int, int, int], None]]:
    """Each format's prefill of a local sink's history (:mod:`sinks_prefill`), with this run's settings."""
    return {
        "parquet": prefill_parquet,
        "delta": prefill_delta,
        "iceberg": functools.partial(prefill_iceberg, catalog_uri=ICEBERG_CATALOG[0], kept=args.iceberg_kept),
    }


def commit_times(
    spark: Any,
    args: argparse.Namespace,
    write: Callable[..., None],
    checkpoints: list[int],
    sink: str,
    prefill: Callable[[str, int, int, int], None] | None = None,
) -> tuple[list[list[float]], list[str]]:
    """Commit small batches one after the other (``prefill``: the first through ``write``, the
    rest up to each checkpoint by ``prefill``, then one untimed ``write``); at each checkpoint the
    medians of ``--samples`` more commits, of as many replays of committed batches and of as many
    replays of batches that never committed (seconds), and the checkpoints' descriptions."""
    medians: list[list[float]] = []
    line: list[str] = []
    batch_id = 0
    never_committed = 10**9  # batch ids far above the sequence: the sink has never seen them

    def timed(batch: int, attempt: int) -> float:
        df, ranges = kafka_rows(spark, args.small_records, 16, first_offset=batch * args.small_records)
        t0 = time.perf_counter()
        write(df, batch, attempt, ranges, args.small_records)
        return time.perf_counter() - t0

    def one() -> float:
        nonlocal batch_id
        batch_id += 1
        return timed(batch_id - 1, 1)

    def replay_committed(i: int) -> float:
        """One of the newest batches committed again, as its second attempt."""
        return timed(batch_id - 1 - i, 2)

    def replay_never_committed() -> float:
        nonlocal never_committed
        never_committed += 1
        return timed(never_committed, 2)

    for checkpoint in checkpoints:
        if prefill is not None and checkpoint - 1 > batch_id:
            if batch_id == 0:
                one()
            prefill(sink, batch_id, checkpoint - 1, args.small_records)
            batch_id = checkpoint - 1
        while batch_id < checkpoint:
            one()
        n = args.samples
        medians.append(
            [
                statistics.median(one() for _ in range(n)),
                statistics.median(replay_committed(i) for i in range(n)),
                statistics.median(replay_never_committed() for _ in range(n)),
            ]
        )
        commit, committed, fresh = (m * 1000 for m in medians[-1])
        line.append(
            f"{checkpoint}: {commit:.0f} ms (replays: of a committed batch {committed:.0f} ms, "
            f"of a batch never committed {fresh:.0f} ms)"
        )
    return medians, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--history", default="10,100", help="batches in the sink at which commits are timed")
    ap.add_argument("--history-locations", default="local", help="comma-separated: local, s3")
    ap.add_argument(
        "--history-formats", default="parquet,delta,iceberg", help="comma-separated: parquet, delta, iceberg"
    )
    ap.add_argument("--small-records", type=int, default=100)
    ap.add_argument(
        "--prefill",
        action="store_true",
        help="fill the history of local sinks between checkpoints without Spark (see the module doc)",
    )
    ap.add_argument(
        "--iceberg-kept",
        type=int,
        default=720,
        help="snapshots the Iceberg prefill keeps: its expiry's retention in intervals (720: 12 h at 60 s)",
    )
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument(
        "--compaction",
        action="store_true",
        help="after each table format's history: queries before and after the table's maintenance",
    )
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

    from kbp_local.s3 import S3Server

    (REPO / ".tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-sinks-", dir=REPO / ".tmp"))
    s3 = S3Server(work / "s3")
    spark = None
    try:
        s3.start()
        s3.create_bucket(BUCKET)
        # the Iceberg sink's catalog, and its pyiceberg client's S3 settings (the AWS environment)
        ICEBERG_CATALOG.append(f"sqlite:///{work}/iceberg-catalog.db")
        os.environ.update(s3.aws_environment())
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
