"""Records/s of the Kafka range Data Source versus a plain kafka-python loop, measured in one run.

Starts an embedded broker, produces ``--records`` records over ``--partitions`` partitions, then
reads the same ranges three ways and prints records/s and the ratio to the plain loop:

* ``kafka-python loop`` — one consumer per range, assign/seek/poll, records only counted;
* ``data source (first)`` / ``(warm)`` — the Data Source in a local[2] session, rows sent to
  Spark's ``noop`` sink (read cost only); the first run includes Python worker start-up;
* ``job (read + parquet)`` — :func:`run_batch`: bounds check, read, counting, Parquet sink, commit.

    .venv/bin/python bench/reader_throughput.py --records 200000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from airflow_kafka_backpressure.local.broker import TansuBroker
from airflow_kafka_backpressure.local.producer import ensure_topic, produce
from airflow_kafka_backpressure.models import BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.spark.environment import spark_conf_defaults, spark_submit_env

REPO = Path(__file__).resolve().parents[1]


def plain_loop(bootstrap: str, ranges: list[OffsetRange]) -> int:
    from kafka import KafkaConsumer, TopicPartition

    n = 0
    for r in ranges:
        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, max_poll_records=10_000)
        tp = TopicPartition(r.topic, r.partition)
        c.assign([tp])
        c.seek(tp, r.from_offset)
        while c.position(tp) < r.until_offset:
            for rec in c.poll(timeout_ms=1000, max_records=10_000).get(tp, ()):
                if rec.offset < r.until_offset:
                    n += 1
        c.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--payload-bytes", type=int, default=100)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-", dir=REPO / ".tmp" if (REPO / ".tmp").exists() else None))
    os.environ.update(spark_submit_env(work))
    with TansuBroker() as broker:
        topic = "bench"
        ensure_topic(broker.bootstrap, topic, args.partitions)
        t0 = time.monotonic()
        produce(
            broker.bootstrap, topic, count=args.records, partitions=args.partitions, payload_bytes=args.payload_bytes
        )
        print(f"produced {args.records} records in {time.monotonic() - t0:.1f}s")
        per = args.records // args.partitions
        ranges = [OffsetRange(topic, p, 0, per) for p in range(args.partitions)]
        total = per * args.partitions

        results: dict[str, float] = {}
        t0 = time.monotonic()
        assert plain_loop(broker.bootstrap, ranges) == total
        results["kafka-python loop"] = total / (time.monotonic() - t0)

        from pyspark.sql import SparkSession

        from airflow_kafka_backpressure.spark.job import run_batch
        from airflow_kafka_backpressure.spark.kafka_range_source import (
            SOURCE_NAME,
            KafkaRangeDataSource,
            range_source_options,
        )

        builder = SparkSession.builder.master("local[2]").appName("kbp-bench")
        for k, v in spark_conf_defaults(work).items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        try:
            spark.dataSource.register(KafkaRangeDataSource)
            opts = range_source_options(ranges, {"bootstrap.servers": broker.bootstrap})
            for label in ("data source (first)", "data source (warm)"):
                t0 = time.monotonic()
                spark.read.format(SOURCE_NAME).options(**opts).load().write.format("noop").mode("overwrite").save()
                results[label] = total / (time.monotonic() - t0)
            plan = BatchPlan("bench", 0, "bench", tuple(ranges), str(work / "sink"), 1000, 0)
            kafka = {"bootstrap.servers": broker.bootstrap}
            spec = JobSpec(plan=plan, kafka=kafka, metrics_path=str(work / "m.json"), launched_at_ms=0)
            t0 = time.monotonic()
            m = run_batch(spark, spec)
            assert m.records == total
            results["job (read + parquet)"] = total / (time.monotonic() - t0)
        finally:
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)

    base = results["kafka-python loop"]
    print(f"\n{total} records, {args.partitions} partitions, {args.payload_bytes}-byte payloads, local[2]")
    for label, rate in results.items():
        print(f"  {label:24s} {rate:>10,.0f} rec/s   ratio {rate / base:.2f}")


if __name__ == "__main__":
    main()
