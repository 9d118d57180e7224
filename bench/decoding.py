"""The cost of decoding: the batch job on Avro records against the same job keeping raw bytes, in one
run, paired.

Starts Apache Kafka (KRaft, one node: :mod:`kbp_local.apache_kafka`) and the local Schema Registry
(:mod:`kbp_local.schema_registry`: Confluent's REST API), produces ``--records`` records (default
1,000,000) over ``--partitions`` partitions, each value encoded by confluent-kafka's own
``AvroSerializer`` (Confluent's wire format: magic byte, schema id, Avro binary) of a five-field
order record (~60 bytes), then runs the whole batch job (``spark.job.run_batch``: bounds check,
Spark's Kafka reader, Parquet sink: fence, write, commit) on every record, two ways:

* ``raw`` — ``value_format: raw``: Kafka's columns as read, ``key``/``value`` bytes;
* ``avro`` — ``value_format: avro``: decoded in the JVM (spark-avro's ``from_avro`` into the
  subject's latest schema), counted (records, bytes, bad records per partition), the value's fields
  written as columns with Kafka's metadata, the (empty) error table.

The runs come in pairs, one of each, in alternating order (raw first, then avro first: neither
always runs in the other's wake); the median of the ``--repeat`` pairs' ratios (raw seconds / avro
seconds: avro's throughput as a share of raw's) is the figure, with the best of each. Goal: avro >= 0.7x raw's throughput on 1,000,000 records.

    .venv/bin/python bench/decoding.py                   # 1,000,000 records, 4 partitions, 8 pairs
    .venv/bin/python bench/decoding.py --records 100000 --repeat 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.batch.models import BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.decoders import decoder_for
from airflow_kafka_backpressure.decoders.decoding import prepare_decoding
from airflow_kafka_backpressure.decoders.registry import ConfluentSchemas
from airflow_kafka_backpressure.engines.environment import spark_conf_defaults, spark_submit_env
from kbp_local.apache_kafka import KafkaBroker
from kbp_local.jars import combined_spark_conf, spark_avro_conf, spark_kafka_conf
from kbp_local.producer import ensure_topic
from kbp_local.schema_registry import SchemaRegistryServer

REPO = Path(__file__).resolve().parents[1]
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "price", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "created_at", "type": "long"},
    ],
}
GOAL = 0.7


def produce(bootstrap: str, registry: Any, topic: str, count: int, partitions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(registry, json.dumps(ORDER))
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 16 * 1024 * 1024, "acks": "all"}
    )
    now = int(time.time() * 1000)
    for i in range(count):
        value = serialize(
            {
                "id": i,
                "item": f"item-{i % 997:04d}",
                "price": (i % 10_000) / 100,
                "quantity": i % 7,
                "created_at": now + i,
            },
            ctx,
        )
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise SystemExit("the producer could not deliver every record within 120 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=8, help="pairs of runs (raw, then avro)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted pairs first")
    args = ap.parse_args()

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import SparkSession

    from airflow_kafka_backpressure.spark.job import run_batch

    tmp_root = REPO / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-decoding-", dir=tmp_root))
    os.environ.update(spark_submit_env(work))
    load_before = os.getloadavg()[0]
    ratios: list[float] = []
    best: dict[str, float] = {}
    try:
        with KafkaBroker(work / "kafka", heap="1g") as broker, SchemaRegistryServer() as server:
            topic = "orders"
            ensure_topic(broker.bootstrap, topic, args.partitions)
            client = SchemaRegistryClient(server.client_config())
            t0 = time.monotonic()
            produce(broker.bootstrap, client, topic, args.records, args.partitions)
            print(f"produced {args.records:,} Avro records in {time.monotonic() - t0:.1f}s", flush=True)
            per = args.records // args.partitions
            ranges = tuple(OffsetRange(topic, p, 0, per) for p in range(args.partitions))
            total = per * args.partitions
            decoding = prepare_decoding(
                {"value": decoder_for("avro", "value")},
                [topic],
                lambda: ConfluentSchemas(client, "the registry"),
            )
            assert decoding is not None

            builder = SparkSession.builder.master(args.master).appName("kbp-bench-decoding")
            conf = combined_spark_conf(spark_kafka_conf(), spark_avro_conf())
            for k, v in spark_conf_defaults(work, conf).items():
                builder = builder.config(k, v)
            spark = builder.getOrCreate()
            attempts = itertools.count(1)
            try:

                def job(kind: str) -> float:
                    plan = BatchPlan("bench", 0, "bench", ranges, str(work / f"sink-{kind}"), 1000, 0)
                    spec = JobSpec(
                        plan=plan,
                        kafka={"bootstrap.servers": broker.bootstrap},
                        launched_at_ms=0,
                        reader="native",
                        attempt=next(attempts),
                        decoding=decoding.to_dict() if kind == "avro" else None,
                    )
                    t = time.monotonic()
                    metrics = run_batch(spark, spec)
                    elapsed = time.monotonic() - t
                    if metrics.records != total or metrics.bad_records:
                        raise SystemExit(
                            f"{kind}: {metrics.records} records, {metrics.bad_records} bad; expected {total}, 0"
                        )
                    print(f"  {kind:5s} {total / elapsed:>10,.0f} rec/s  ({elapsed:.2f}s)", flush=True)
                    return elapsed

                for i in range(args.warmup + args.repeat):
                    if i == args.warmup:
                        print("timed pairs:", flush=True)
                    elif i == 0:
                        print(f"warm-up ({args.warmup} pair(s), not counted):", flush=True)
                    # the order alternates pair by pair: neither runs always right after the other
                    if i % 2 == 0:
                        raw, avro = job("raw"), job("avro")
                    else:
                        avro, raw = job("avro"), job("raw")
                    if i >= args.warmup:
                        ratios.append(raw / avro)
                        best["raw"] = max(best.get("raw", 0.0), total / raw)
                        best["avro"] = max(best.get("avro", 0.0), total / avro)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    median = statistics.median(ratios)
    print(
        f"\n{total:,} records, {args.partitions} partitions, Avro values of {len(ORDER['fields'])} fields, "
        f"{args.master}, {args.repeat} pairs after {args.warmup} warm-up; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)"
    )
    print(f"  raw   best {best['raw']:>10,.0f} rec/s")
    print(f"  avro  best {best['avro']:>10,.0f} rec/s   ratio {best['avro'] / best['raw']:.2f}")
    print(
        f"goal: avro >= {GOAL}x raw's throughput (paired median of {len(ratios)}: "
        f"{', '.join(f'{r:.2f}' for r in sorted(ratios))}): {median:.2f}x, {'met' if median >= GOAL else 'NOT met'}"
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
